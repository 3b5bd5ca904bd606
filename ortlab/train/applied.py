"""What really applied: ORTTrainer's verification of each acceleration it was asked for, and its record.

Mixed into `ORTTrainer` (ortlab.train.trainer), which calls `_after_first_steps` from its metrics callback after
the first step (ORT has exported by then, the optimizer's state exists) and again at the end. Each acceleration
is checked against what runs, not what was configured: ORTModule built a training session and did not fall back,
DeepSpeed runs the ZeRO stage asked for, the Linear layers computed in the precision asked for, torch's matmuls
run in TF32 on tensor cores, Dynamo compiled frames. Whatever was asked for and is not applied is reported once,
with a warning (`AccelerationNotApplied`), an error log line and an `acceleration` event in the metrics stream;
the record (`trainer.accelerations`) goes next to every saved model (`ortlab_accelerations.json`).

Kept apart from the trainer's seams so that the trainer module holds only what overrides transformers.Trainer,
and this one only the bookkeeping, which overrides nothing of Trainer.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.accel import Applied, ort, tcmalloc, zero
from ortlab.accel.precision import TF32_CAPABILITY, tf32_on, tf32_state
from ortlab.adapters import optimizer_state_bytes, parameter_counts
from ortlab.runfolder import events
from ortlab.train.args import checkpointing_on, checkpointing_requested

logger = logging.getLogger("ortlab")

ACCELERATIONS_FILE = "ortlab_accelerations.json"


class AccelerationNotApplied(UserWarning):
    """An acceleration that was requested is not in effect (e.g. ORTModule fell back to PyTorch)."""


class VerifiesAccelerations:
    """ORTTrainer's verification of what applied. It reads what the trainer sets up: `args`, `accelerations`
    (name -> Applied), `_ort_module`, `_precision_probe`, `_reported`, `parameters_record`, `metrics_sink`, and
    Trainer's own `model`, `model_wrapped`, `optimizer`, `accelerator`, `state`, `callback_handler`."""

    def _after_first_steps(self, global_step: int, final: bool = False) -> None:
        """Verify what applied once the first step ran (ORT has exported by then), and again at the end."""
        if not final and global_step != 1:
            return
        self._verify_ort()
        self._verify_zero()
        self._verify_precision()
        self._verify_tf32()
        self._verify_tcmalloc()
        self._verify_torch_compile(final)
        self._verify_gradient_checkpointing()
        self._record_parameters()
        if not final and self.args.report_to and self.is_world_process_zero():
            from ortlab.trackers import log_applied

            applied = {k: v.applied for k, v in self.accelerations.items()}
            log_applied(self.callback_handler.callbacks, self.args, applied)
        if not final and self.is_world_process_zero():
            # What applied, known from the first step on: a running run's views show it (not only train_end's).
            accelerations = {k: v.to_dict() for k, v in self.accelerations.items()}
            self.metrics_sink({"event": events.VERIFIED, "step": global_step, "accelerations": accelerations})

    def _record_parameters(self) -> None:
        """Once, after the first step of this process's training (the optimizer's state exists only then)."""
        if self.parameters_record is not None or self.optimizer is None:
            return

        counts = parameter_counts(self.model)
        self.parameters_record = {
            **counts,
            "trainable_share": counts["trainable"] / counts["total"] if counts["total"] else None,
            "optimizer_state_bytes": optimizer_state_bytes(self.optimizer),
        }
        if self.is_world_process_zero():
            self.metrics_sink({"event": events.PARAMETERS, "step": self.state.global_step, **self.parameters_record})

    def _verify_ort(self) -> None:
        record = self.accelerations["ort"]
        if not record.requested or self._ort_module is None:
            return
        reason = ort.fallback_reason(self._ort_module)
        ran = ort.ran_in_ort(self._ort_module)
        record.applied = ran and reason is None
        record.details.update(
            {
                "options": {
                    "log_level": self.args.ort_log_level,
                    "memory_opt_level": self.args.ort_memory_opt_level,
                    "fallback": self.args.ort_fallback,
                    "save_onnx_path": self.args.ort_save_onnx_path,
                    "check_forward": self.args.ort_check_forward,
                },
                "device": self.args.device.type,
            }
        )
        if reason:
            record.details["fallback_reason"] = reason
        operator = ort.unsupported_operator(reason or "")
        if operator:
            record.details["unsupported_operator"] = operator
        if not record.applied:
            if reason:
                lines = [line.strip() for line in reason.splitlines() if line.strip()]
                # The first line says what failed, the last one why; the whole error is in details.fallback_reason.
                summary = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
                if operator:
                    summary = f"the ONNX export does not support the operator {operator} ({summary})"
                why = f"ORTModule fell back to PyTorch: {summary}"
            else:
                why = "ONNX Runtime never ran a training step (did training run any step?)"
            self._report_not_applied(record, why)

    def _verify_zero(self) -> None:
        record = self.accelerations["zero1"]
        if not record.requested:
            return
        engine = self.model_wrapped
        stage = engine.zero_optimization_stage() if type(engine).__name__ == "DeepSpeedEngine" else 0
        record.applied = stage == self.args.zero_stage
        world = self.args.world_size
        record.details.update({"stage": stage, "label": f"ZeRO-{stage}", "world_size": world})
        share = _optimizer_state_share(self.optimizer, self.model)
        if share is not None:
            # Measured, not configured: the Adam moments this process holds, against one full copy of them.
            record.details["optimizer_state_share"] = share
        if world > 1:  # every rank's share, measured on that rank (every rank verifies, so every rank gathers)
            gathered = zero.gather_floats([-1.0 if share is None else share], self.args.device)
            record.details["optimizer_state_share_by_rank"] = [None if v < 0 else v for (v,) in gathered]
        if world == 1:
            record.details["note"] = "one process shards nothing: ZeRO saves memory only across several processes"
        if not record.applied:
            self._report_not_applied(record, f"DeepSpeed is running ZeRO stage {stage}")

    def _verify_precision(self) -> None:
        engine = self.model_wrapped
        if type(engine).__name__ == "DeepSpeedEngine":
            configured = "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32"
        else:
            configured = str(self.accelerator.mixed_precision).lower().replace("no", "fp32")
        probe = self._precision_probe
        observed = probe.observed() if probe is not None else None
        if probe is not None:
            probe.remove()
        if observed is not None:
            active = observed["precision"]
            how = "observed: the dtype the Linear layers computed in during the first step"
            if self._ort_module is not None:
                how += " (under ORT: while ORT exported the forward it then runs)"
        elif self.args.torch_compile:
            active, how = configured, "from the configuration only: not observed under torch.compile"
        else:
            active, how = configured, "from the configuration only: no Linear layer's forward was observed"
        for name in ("fp16", "bf16"):
            record = self.accelerations[name]
            record.applied = active == name
            record.details.update({"active_precision": active, "configured_precision": configured, "verified_by": how})
            if observed is not None:
                record.details["observed"] = observed
            if record.requested and not record.applied:
                self._report_not_applied(record, f"training runs in {active} ({how})")

    def _verify_tf32(self) -> None:
        """TF32 applies when torch's fp32 matmuls really run in TF32 (the flags observed now, after transformers
        set them up) on a GPU that has TF32 tensor cores; bf16/fp16 matmuls do not use it either way."""

        record = self.accelerations["tf32"]
        state = tf32_state()
        device = self.args.device
        on = tf32_on(state)
        capable = False
        if device.type == "cuda":
            import torch

            capable = tuple(torch.cuda.get_device_capability(device)) >= TF32_CAPABILITY
        record.applied = bool(on and capable)
        record.details.update({**state, "device": device.type, "tensor_cores": capable})
        if self.args.fp16 or self.args.bf16:
            record.details["note"] = "the matmuls run in fp16/bf16; TF32 concerns only what stays fp32"
        if record.requested and not record.applied:
            why = "no CUDA device with TF32 tensor cores" if not capable else "torch's fp32 matmuls are not in TF32"
            self._report_not_applied(record, why)

    def _verify_tcmalloc(self) -> None:
        """tcmalloc applies when the loader mapped it into this process (its own record, /proc/self/maps): an
        `LD_PRELOAD` the loader could not follow is ignored with a line on stderr, and training goes on with glibc's
        malloc. Recorded either way, so a run started with it by hand says so too."""
        record = self.accelerations["tcmalloc"]
        path = tcmalloc.loaded()
        record.applied = path is not None
        record.details["library"] = str(path) if path is not None else None
        if record.requested and not record.applied:
            self._report_not_applied(record, "this process runs with glibc's malloc (LD_PRELOAD did not load it)")

    def _verify_torch_compile(self, final: bool = False) -> None:
        """Applied only when the model that trains is a compiled module AND Dynamo compiled frames of it: a
        wrapper whose every frame fell back to eager (graph breaks everywhere, a compile error swallowed by
        `suppress_errors`) compiles nothing."""
        record = self.accelerations["torch_compile"]
        if not record.requested:
            return
        import sys

        import torch

        trained = _unwrap_engine(self.model_wrapped)
        compiled = hasattr(trained, "_orig_mod")
        dynamo = sys.modules.get("torch._dynamo.utils")  # imported by torch.compile: absent means never compiled
        counters = getattr(dynamo, "counters", {}) if dynamo is not None else {}
        frames = int(counters.get("frames", {}).get("ok", 0)) if counters else 0
        graphs = int(counters.get("stats", {}).get("unique_graphs", 0)) if counters else 0
        record.applied = compiled and frames > 0
        if not final:
            self._frames_after_first_step = frames
        else:
            # New batch shapes after the first step make Dynamo compile again: counted, so padding/bucketing shows.
            record.details["compiles_after_first_step"] = frames - getattr(self, "_frames_after_first_step", frames)
        record.details.update(
            {
                "module": type(trained).__name__,
                "frames_compiled": frames,
                "graphs": graphs,
                "backend": self.args.torch_compile_backend or "inductor",
                "torch": torch.__version__,
                "python": sys.executable,
            }
        )
        if not compiled:
            self._report_not_applied(record, "the model that trains is not a compiled module")
        elif not record.applied:
            self._report_not_applied(record, "Dynamo compiled no frame of the model (every frame ran eagerly)")

    def _verify_gradient_checkpointing(self) -> None:
        """Applied only when layers really ran their forward again inside the backward pass (`RecomputeProbe`):
        the model's own flag (`checkpointing_on`) says it was switched on, not that any layer of this
        model honours it (a custom model, a layer class transformers does not wrap, a wrapper in between)."""
        probe = self._recompute_probe
        if not checkpointing_requested(self.args) or "gradient_checkpointing" in self._reported:
            return
        record = self.accelerations.setdefault("gradient_checkpointing", Applied("gradient_checkpointing", True))
        if probe is None or probe.forwards == 0:
            if record.details.get("verified_by"):
                return  # (verified after the first step: the final call keeps that)
            record.applied = checkpointing_on(self.model)
            record.details["verified_by"] = "the model's flag only: no Linear forward was observed"
            return
        probe.remove()
        self._recompute_probe = None
        record.applied = probe.recomputed > 0
        record.details.update(
            {
                "linear_forwards": probe.forwards,
                "recomputed_in_backward": probe.recomputed,
                "verified_by": "observed: Linear layers that ran their forward again inside the first backward pass",
            }
        )
        if not record.applied:
            flag = checkpointing_on(self.model)
            self._report_not_applied(
                record,
                f"no layer ran its forward again in the backward pass, so every activation was kept (the model's "
                f"flag says {'on' if flag else 'off'})",
            )

    def _report_not_applied(self, record: Applied, why: str) -> None:
        if record.name in self._reported:
            return
        self._reported.add(record.name)
        message = f"ortlab: {record.name} was requested but is NOT applied: {why}"
        logger.error(message)
        warnings.warn(message, AccelerationNotApplied, stacklevel=2)
        if self.is_world_process_zero():
            self.metrics_sink({"event": events.ACCELERATION, **record.to_dict(), "message": message})

    def _write_accelerations(self, output_dir: str) -> None:
        if not self.is_world_process_zero():
            return
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        data = {"feature": self.feature, "accelerations": {k: v.to_dict() for k, v in self.accelerations.items()}}
        safeio.write_json(output_dir, ACCELERATIONS_FILE, data)


class RecomputeProbe:
    """Watches one training step: does any Linear layer run its forward inside the backward pass? That is what
    activation checkpointing is (a checkpointed layer's forward runs again when its gradients are needed, reentrant
    or not), whatever flag says it is on. Removed after the first step (`_verify_gradient_checkpointing`)."""

    def __init__(self, model: Any):
        import torch

        self.forwards, self.recomputed = 0, 0
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self._handles = [m.register_forward_hook(self._hook) for m in linears]

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        self.forwards += 1
        # (-1 outside a backward pass; torch has no public name for "inside autograd's engine")
        if torch._C._current_graph_task_id() != -1:
            self.recomputed += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _optimizer_state_share(optimizer: Any, model: Any) -> float | None:
    """The share of the optimizer's moment state (exp_avg) this process holds, of one copy for the whole model.

    1.0 is an unsharded optimizer; ZeRO-1/2 over N processes hold ~1/N each. None when no state exists yet.
    """
    inner = optimizer
    while getattr(inner, "optimizer", None) is not None and inner.optimizer is not inner:
        inner = inner.optimizer
    state = getattr(inner, "state", None)
    if not state:
        return None
    held = sum(s["exp_avg"].numel() for s in state.values() if isinstance(s, dict) and "exp_avg" in s)
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return held / total if total and held else None


def _unwrap_engine(model: Any) -> Any:
    return model.module if type(model).__name__ in ("DeepSpeedEngine", "DistributedDataParallel") else model
