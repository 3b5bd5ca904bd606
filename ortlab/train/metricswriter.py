"""Per-step metrics as JSON lines: the one stream every view of a run (widgets, CLI, sidebar) follows.

One line per event, appended and flushed at once, so a reader tailing the file sees each step as it ends and
a killed process leaves only whole lines behind (the last one at worst cut short, which readers skip).

What each event's record holds (its fields, their types and units, which views draw them) is written once, in
`ortlab.runfolder.records`; tests hold what this writes to it (`tests/test_records.py`).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from transformers import TrainerCallback

from ortlab import safeio
from ortlab.accel.precision import tf32_on, tf32_state
from ortlab.accel.zero import gather_floats
from ortlab.flops import METHOD as FLOPS_METHOD
from ortlab.flops import Peak, matmul_precision, measured, peak_flops
from ortlab.peak import measured_peak
from ortlab.runfolder import events
from ortlab.runfolder.compare import summarize
from ortlab.train.args import checkpointing_on


class JsonLinesSink:
    """Append-only JSON-lines writer; `None` path writes nothing (but still calls `also`).

    `keep=True` also keeps every record in `records`: the stream of a trainer that has no file to write to (a
    script's ORTTrainer without a run folder or logging_dir) stays readable in memory.
    """

    def __init__(self, path: str | os.PathLike | None, also: Callable[[dict], None] | None = None, keep: bool = False):
        self.path = Path(path) if path else None
        self.also = also
        self.keep = keep
        self.records: list[dict[str, Any]] = []
        self._file: IO[str] | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        # JSON has no NaN/inf: at every depth (a diverged run's train_end summary.final_loss) they are written as
        # null, never as `NaN`, which other readers (a browser's JSON.parse) reject.
        record = safeio.finite(record)
        record.setdefault("time", time.time())
        if self.keep:
            self.records.append(record)
        if self.path is not None:
            if self._file is None:
                self._file = self._open()
            self._file.write(safeio.dumps(record) + "\n")
            self._file.flush()
        if self.also is not None:
            self.also(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> IO[str]:
        """The file, opened for append without following a link at its name (a run folder may be planted)."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = safeio.open_in(self.path.parent, self.path.name, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        f = os.fdopen(fd, "a", encoding="utf-8")
        if torn:  # a writer killed mid-line (then a resume): end the torn line, or it would swallow this record
            f.write("\n")
        return f


def device_info(device: Any, precision: str) -> dict[str, Any]:
    """What per-step device numbers rest on, written once in `train_begin`: the device, the precision the matmuls
    run in, the peak MFU is held against (measured on this machine, `ortlab.peak`; on a GPU the datasheet's peak
    beside it, or why there is none), whether NVML utilisation is read."""

    if device.type != "cuda":
        mfu = _measured(precision, "cpu", 0)
        return {"type": device.type, "name": device.type, "mfu": mfu, "memory": "cpu_peak_rss"}
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)

    tf32 = tf32_on(tf32_state())
    mp = matmul_precision(precision, tf32)
    return {
        "type": "cuda",
        "name": name,
        "index": index,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "tf32_matmul": tf32,
        "mfu": _measured(mp, "cuda", index),
        "mfu_datasheet": peak_flops(name, mp).to_dict(),
        "memory": "cuda allocator: allocated, reserved, peak within the step",
    }


def _measured(precision: str, device_type: str, index: int) -> dict[str, Any]:
    """The measured peak of `precision` on the device (cached, or measured now: about a second), as a Peak dict."""

    name = "cpu" if device_type == "cpu" else f"cuda:{index}"
    try:
        peak, cached = measured_peak(precision, device_type, index)
    except Exception as e:  # no MFU is better than a failed run: the record says why
        return Peak(name, precision, None, reason=f"the matmul peak could not be measured: {e}"[:300]).to_dict()
    return measured(peak.device, precision, peak.flops, peak.size, peak.threads, cached).to_dict()


class _Nvml:
    """GPU utilisation from NVML (nvidia-ml-py's `pynvml`) where it is installed; silent None elsewhere."""

    def __init__(self, index: int):
        self.handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._pynvml = pynvml
        except Exception:  # not installed, no driver: utilisation is simply not reported
            self.handle = None

    def utilisation(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return float(self._pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except Exception:
            return None


# The CUDA allocator's peak is reset at each step's start (for the per-step peak); the peak of the whole process so
# far is kept here, so `peak_memory_mb` still means "since the start".
_cuda_peak_mb = 0.0


def peak_memory_mb(device_type: str) -> tuple[float, str]:
    """Peak memory so far: CUDA allocator peak on GPU, process peak RSS on CPU (what the OS had to give)."""
    global _cuda_peak_mb
    if device_type == "cuda":
        import torch

        _cuda_peak_mb = max(_cuda_peak_mb, torch.cuda.max_memory_allocated() / 2**20)
        return _cuda_peak_mb, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_peak_rss"


class StepMetricsCallback(TrainerCallback):
    """Times each optimizer step and writes one `step` line per step (rank 0 only).

    The trainer counts samples, tokens and the loss of the micro-batches in `training_step`; the time runs from
    `on_step_begin` to `on_step_end` (forward, backward, optimizer), so batch fetching and evaluation are out.

    With several processes, every rank's step time and peak memory are gathered into the step line (`workers`, by
    rank, with each rank's loss), so a straggler shows; the step's loss is the mean of every rank's (equal shares of
    the batch).
    `recorded_through`: steps up to this one are already in the stream (a worker group restarted from an earlier
    checkpoint trains them again): they are not written twice.
    """

    def __init__(self, trainer: Any, sink: Callable[[dict], None]):
        self.trainer = trainer
        self.sink = sink
        self.steps: list[dict[str, Any]] = []
        self._t0 = 0.0
        self._lr: float | None = None
        self._train_start = 0.0
        self.device: dict[str, Any] = {}
        self._peak_flops: float | None = None
        self._datasheet_flops: float | None = None
        self._nvml: _Nvml | None = None
        self.recorded_through = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_start = time.perf_counter()
        precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        self.device = device_info(args.device, precision)
        self._peak_flops = self.device["mfu"].get("flops")
        self._datasheet_flops = self.device.get("mfu_datasheet", {}).get("flops")
        shape = self.trainer._model_shape()
        self.device["flops"] = {"method": FLOPS_METHOD, "model": shape.to_dict() if shape else None}
        # The attention the model trains with (transformers' sdpa by default; eager only where ORT needs it).
        config = getattr(self.trainer.model, "config", None)
        self.device["attention"] = getattr(config, "_attn_implementation", None)
        # Recomputing layers in the backward pass (hyper.gradient_checkpointing), as the model's flag says; whether
        # layers really recomputed is verified after the first step (accelerations["gradient_checkpointing"]).
        self.device["gradient_checkpointing"] = checkpointing_on(self.trainer.model)
        if shape is None:
            self.device["mfu"]["reason"] = "the model's config names no layer count / hidden size: no FLOP count"
            self._peak_flops = self._datasheet_flops = None
        if args.device.type == "cuda":
            self._nvml = _Nvml(self.device["index"])
            self.device["gpu_util"] = "NVML" if self._nvml.handle is not None else "not read: pip install nvidia-ml-py"
        if state.is_world_process_zero:
            self.sink(
                {
                    "event": events.TRAIN_BEGIN,
                    "max_steps": state.max_steps,
                    "world_size": args.world_size,
                    "device": self.device,
                    "accelerations": {k: v.to_dict() for k, v in self.trainer.accelerations.items()},
                }
            )

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer._reset_step_counters()
        if args.device.type == "cuda":
            import torch

            peak_memory_mb("cuda")  # keep the running peak before the per-step reset
            torch.cuda.reset_peak_memory_stats(args.device)
        self._t0 = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._lr = self.trainer._get_learning_rate()

    def on_step_end(self, args, state, control, **kwargs):
        if args.device.type == "cuda":
            import torch

            torch.cuda.synchronize(args.device)  # the step's kernels are queued: time them, not their launch
        dt = time.perf_counter() - self._t0
        self.trainer._after_first_steps(state.global_step)
        counters = self.trainer._step_counters
        world = max(1, args.world_size)
        samples, tokens = counters["samples"] * world, counters["tokens"] * world
        mem, mem_kind = peak_memory_mb(args.device.type)
        loss, every = counters["loss"], None
        if args.world_size > 1:
            every = gather_floats([dt, mem, loss], args.device)  # (dt measured before the gather: it does not count)
            # The step's loss is every rank's (each trained its share of the batch), as Trainer's own logged loss
            # is: rank 0's alone made a 2-process run's curve differ from the same batch on one process.
            loss = sum(rank_loss for _, _, rank_loss in every) / len(every)
        record = {
            "event": events.STEP,
            "step": state.global_step,
            "epoch": state.epoch,
            "loss": loss,
            "learning_rate": self._lr,
            "step_time_s": dt,
            "samples": samples,
            "tokens": tokens,
            "samples_per_s": samples / dt if dt > 0 else None,
            "tokens_per_s": tokens / dt if dt > 0 else None,
            "peak_mem_mb": mem,
            "mem_kind": mem_kind,
        }
        record.update(self._device_numbers(args, counters["flops"] * world, dt))
        record.update(self.trainer._step_extras())  # e.g. rewards/chosen, rewards/accuracies (preference training)
        if every is not None:
            record["workers"] = [{"step_time_s": t, "peak_mem_mb": m, "loss": x} for t, m, x in every]
        self.steps.append(record)
        if state.is_world_process_zero and state.global_step > self.recorded_through:
            self.sink(record)

    def _device_numbers(self, args: Any, flops: float, dt: float) -> dict[str, Any]:
        """Model FLOP/s and MFU (all processes together, against their summed peaks); GPU memory of this process."""
        out: dict[str, Any] = {}
        if flops and dt > 0:
            out["model_tflops_per_s"] = flops / dt / 1e12
            for key, peak in (("mfu", self._peak_flops), ("mfu_datasheet", self._datasheet_flops)):
                if peak:
                    out[key] = flops / dt / (peak * max(1, args.world_size))
        if args.device.type == "cuda":
            import torch

            out["gpu_mem_allocated_mb"] = torch.cuda.memory_allocated(args.device) / 2**20
            out["gpu_mem_reserved_mb"] = torch.cuda.memory_reserved(args.device) / 2**20
            out["gpu_mem_step_peak_mb"] = torch.cuda.max_memory_allocated(args.device) / 2**20
            if self._nvml is not None and (util := self._nvml.utilisation()) is not None:
                out["gpu_util_pct"] = util
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if any(k.startswith("eval_") for k in logs):
            # The one place evaluations are written: `trainer.eval_phase` ("before"/"after", set by whoever
            # evaluates around training) or "during" for evaluations inside the training loop.
            phase = getattr(self.trainer, "eval_phase", None) or "during"
            if "eval_loss" in logs and getattr(self.trainer, "perplexity", False):
                from ortlab.scores import add_perplexity

                logs = add_perplexity(dict(logs))
            self.sink({"event": events.EVAL, "phase": phase, "step": state.global_step, **logs})
        else:
            self.sink({"event": events.LOG, "step": state.global_step, **logs})

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer._after_first_steps(state.global_step, final=True)
        if state.is_world_process_zero:
            self.sink(
                {
                    "event": events.TRAIN_END,
                    "step": state.global_step,
                    "summary": self.summary(args.metrics_warmup_steps),
                    "accelerations": {k: v.to_dict() for k, v in self.trainer.accelerations.items()},
                }
            )

    def summary(self, warmup_steps: int) -> dict[str, Any]:
        """Warm-up (ORT export and graph build land in the first steps) apart from steady-state throughput."""

        return {**summarize(self.steps, warmup_steps), "train_time_s": time.perf_counter() - self._train_start}
