"""`ORTTrainer`: a `transformers.Trainer` that applies the acceleration mix and never pretends.

It overrides Trainer's seams only, never its training loop (Optimum's ORTTrainer copied ~470 lines of that
loop, broke with each transformers release, and was removed):

- `train`               wraps the model in ORTModule for the duration of training. Trainer then hands the
                        ORTModule to Accelerate/DeepSpeed like any model, so ORT composes with ZeRO and DDP.
- `create_optimizer`    picks the fused AdamW for `optim="adamw_ort_fused"` and records what was created.
- `training_step`       counts samples/tokens/loss for the per-step metrics, and turns ORT failures into an
                        error that says what to change.
- `_save`               saves the plain transformers model (never the ORTModule wrapper), plus the record of
                        what really applied, so `from_pretrained` loads the result.

What really applied is verified after the first step and at the end (`trainer.accelerations`), written to
`<output_dir>/ortlab_accelerations.json` and to the metrics stream, and every acceleration that was asked for but
did not apply is reported with a warning and an error log line.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainingArguments

from ortlab.accel import Applied, fused_adam, ort
from ortlab.runner.rundir import write_json
from ortlab.tasks import check_model_matches
from ortlab.train.args import ORTTrainingArguments
from ortlab.train.metrics import JsonLinesSink, StepMetricsCallback

logger = logging.getLogger("ortlab")

ACCELERATIONS_FILE = "ortlab_accelerations.json"


class AccelerationNotApplied(UserWarning):
    """An acceleration that was requested is not in effect (e.g. ORTModule fell back to PyTorch)."""


class ORTTrainer(Trainer):
    """Drop-in for Optimum's `ORTTrainer`: `ORTTrainer(model=..., args=ORTTrainingArguments(...), ...,
    feature="sequence-classification")`.

    `feature` names the model's task head (see `ortlab.tasks`); it is checked against the model and recorded.
    `on_metrics`, if given, receives every metrics record (a dict) as it is written.
    """

    def __init__(
        self,
        model: Any = None,
        args: TrainingArguments | None = None,
        *positional: Any,
        feature: str | None = None,
        on_metrics: Any = None,
        **kwargs: Any,
    ):
        args = _as_ort_args(args)
        if feature is not None and model is not None:
            check_model_matches(model, feature)
        self.feature = feature
        # Trainer.__init__ sets config.use_cache = args.use_cache (False) for good, and ORT needs it off too; the
        # saved model gets the user's value back (a causal LM must keep generating with its KV cache).
        self._user_use_cache = getattr(getattr(model, "config", None), "use_cache", None)
        changes = ort.prepare_model(model) if (args.use_ort and model is not None) else {}
        super().__init__(model, args, *positional, **kwargs)
        if self.model_accepts_loss_kwargs and model is not None and not _loss_uses_num_items(model):
            # transformers decides from `**kwargs` in forward() that the model divides its loss by the number of
            # label tokens in the whole (multi-process) batch, and then multiplies the loss by the number of
            # processes. Classification heads take a plain mean instead, so with N processes their loss and
            # gradients came out N times too large. Only models that pass **kwargs on to their loss honour it.
            self.model_accepts_loss_kwargs = False
        self.accelerations: dict[str, Applied] = {
            name: Applied(name, requested) for name, requested in args.mix.requested().items()
        }
        if changes:
            self.accelerations["ort"].details["model_changes"] = changes
        self._ort_module: Any = None
        self._reported: set[str] = set()
        self._step_counters: dict[str, float] = {"samples": 0, "tokens": 0, "loss": 0.0}
        self.metrics_sink = JsonLinesSink(args.metrics_path or None, also=on_metrics)
        self.step_metrics = StepMetricsCallback(self, self.metrics_sink)
        self.add_callback(self.step_metrics)

    # --- seams ---------------------------------------------------------------------------------------------

    def train(self, *args: Any, **kwargs: Any):
        plain = self.model
        if self.args.use_ort:
            self._prepare_for_ort(plain)  # again: model_init may have built a new model
            if self._ort_module is None or self._ort_module.module is not plain:
                self._ort_module = ort.wrap(plain, self.args.ort_options)
            # Both references: Trainer prepares `self.model` with Accelerate/DeepSpeed only when the model it is
            # about to train *is* self.model. Saving goes through `_save`, which unwraps again.
            self.model = self.model_wrapped = self._ort_module
        try:
            return super().train(*args, **kwargs)
        finally:
            self.model = plain
            self._write_accelerations(self.args.output_dir)
            self.metrics_sink.close()

    def _prepare_for_ort(self, model: Any) -> None:
        changes = ort.prepare_model(model)
        if changes:
            self.accelerations["ort"].details.setdefault("model_changes", {}).update(changes)

    def create_optimizer(self, model: Any = None):
        if self.optimizer is None and self.args.fused_adam and self.optimizer_cls_and_kwargs is None:
            cls, extra, _ = fused_adam.optimizer_cls_and_kwargs(self.args.device.type)
            # lr, betas, eps and weight decay still come from the arguments, as in Trainer.
            kw = {
                "lr": self.args.learning_rate,
                "betas": (self.args.adam_beta1, self.args.adam_beta2),
                "eps": self.args.adam_epsilon,
                **extra,
            }
            self.optimizer_cls_and_kwargs = (cls, kw)
        optimizer = super().create_optimizer(model)
        fused, implementation = fused_adam.describe(optimizer)
        record = self.accelerations["fused_adam"]
        record.applied = record.requested and fused
        record.details["implementation"] = implementation
        if record.requested and not fused:
            self._report_not_applied(record, f"the optimizer that was created is {implementation}")
        return optimizer

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None):
        self._count_inputs(inputs)
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)
        except Exception as e:
            if self._ort_module is not None and ort.is_ort_error(e):
                raise ort.ORTFallbackError(_ort_failure_message(e, self.args.ort_fallback)) from e
            raise
        self._step_counters["loss"] += float(loss)
        return loss

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        if self.is_deepspeed_enabled and self.deepspeed is None and self.args.zero_stage < 3:
            # Before training, transformers evaluates a DeepSpeed model by starting a DeepSpeed inference engine,
            # which only exists for ZeRO-3. Stages 1 and 2 leave the parameters whole: evaluate the plain model.
            self.is_deepspeed_enabled = False
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                self.is_deepspeed_enabled = True
        return super().evaluate(*args, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        current = self.model
        self.model = _unwrap_ort(current)
        config = getattr(self.model, "config", None)
        training_use_cache = getattr(config, "use_cache", None)
        try:
            if self._user_use_cache is not None and config is not None:
                config.use_cache = self._user_use_cache
            super()._save(output_dir, state_dict)
        finally:
            if config is not None and training_use_cache is not None:
                config.use_cache = training_use_cache
            self.model = current
        self._write_accelerations(output_dir or self.args.output_dir)

    # --- what really applied -------------------------------------------------------------------------------

    def _reset_step_counters(self) -> None:
        self._step_counters = {"samples": 0, "tokens": 0, "loss": 0.0}

    def _count_inputs(self, inputs: dict[str, Any]) -> None:
        ids = inputs.get("input_ids")
        mask = inputs.get("attention_mask")
        first = ids if ids is not None else next((v for v in inputs.values() if hasattr(v, "shape")), None)
        if first is not None and len(first.shape) > 0:
            self._step_counters["samples"] += int(first.shape[0])
        if mask is not None:
            self._step_counters["tokens"] += int(mask.sum())
        elif ids is not None:
            self._step_counters["tokens"] += int(ids.numel())

    def _after_first_steps(self, global_step: int, final: bool = False) -> None:
        """Verify what applied once the first step ran (ORT has exported by then), and again at the end."""
        if not final and global_step != 1:
            return
        self._verify_ort()
        self._verify_zero()
        self._verify_precision()
        self._verify_torch_compile()

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
                },
                "device": self.args.device.type,
            }
        )
        if reason:
            record.details["fallback_reason"] = reason
        if not record.applied:
            why = reason or "ONNX Runtime never built a training session for the model"
            self._report_not_applied(record, f"ORTModule fell back to PyTorch: {why}")

    def _verify_zero(self) -> None:
        record = self.accelerations["zero1"]
        if not record.requested:
            return
        engine = self.model_wrapped
        stage = engine.zero_optimization_stage() if type(engine).__name__ == "DeepSpeedEngine" else 0
        record.applied = stage == self.args.zero_stage
        record.details.update({"stage": stage, "world_size": self.args.world_size})
        if not record.applied:
            self._report_not_applied(record, f"DeepSpeed is running ZeRO stage {stage}")

    def _verify_precision(self) -> None:
        engine = self.model_wrapped
        if type(engine).__name__ == "DeepSpeedEngine":
            active = "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32"
        else:
            active = str(self.accelerator.mixed_precision).lower().replace("no", "fp32")
        for name in ("fp16", "bf16"):
            record = self.accelerations[name]
            record.applied = active == name
            record.details["active_precision"] = active
            if record.requested and not record.applied:
                self._report_not_applied(record, f"training runs in {active}")

    def _verify_torch_compile(self) -> None:
        record = self.accelerations["torch_compile"]
        record.applied = record.requested and hasattr(_unwrap_engine(self.model_wrapped), "_orig_mod")
        if record.requested and not record.applied:
            self._report_not_applied(record, "the model that trains is not a compiled module")

    def _report_not_applied(self, record: Applied, why: str) -> None:
        if record.name in self._reported:
            return
        self._reported.add(record.name)
        message = f"ortlab: {record.name} was requested but is NOT applied: {why}"
        logger.error(message)
        warnings.warn(message, AccelerationNotApplied, stacklevel=2)
        if self.is_world_process_zero():
            self.metrics_sink({"event": "acceleration", **record.to_dict(), "message": message})

    def _write_accelerations(self, output_dir: str) -> None:
        if not self.is_world_process_zero():
            return
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        data = {"feature": self.feature, "accelerations": {k: v.to_dict() for k, v in self.accelerations.items()}}
        write_json(Path(output_dir) / ACCELERATIONS_FILE, data)


def _loss_uses_num_items(model: Any) -> bool:
    """Does this model's forward hand `num_items_in_batch` (via **kwargs) to its loss function?"""
    import inspect
    import re

    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return True  # cannot tell: keep transformers' decision
    return "num_items_in_batch" in source or re.search(r"loss_function\([^)]*\*\*kwargs", source, re.S) is not None


def _unwrap_ort(model: Any) -> Any:
    return model.module if type(model).__name__ == "ORTModule" else model


def _unwrap_engine(model: Any) -> Any:
    return model.module if type(model).__name__ in ("DeepSpeedEngine", "DistributedDataParallel") else model


def _as_ort_args(args: TrainingArguments | None) -> ORTTrainingArguments:
    if args is None:
        return ORTTrainingArguments(output_dir="ortlab_output")
    if isinstance(args, ORTTrainingArguments):
        return args
    # A plain TrainingArguments: keep every value the user set, add ortlab's defaults (ORT on).
    values = {f.name: getattr(args, f.name) for f in fields(TrainingArguments) if f.init}
    return ORTTrainingArguments(**values)


def _ort_failure_message(e: BaseException, policy: str) -> str:
    first = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
    if policy == "error":
        return (
            f"ORTModule could not train this model ({type(e).__name__}: {first}) and ort_fallback='error' is set. "
            "Set ort_fallback='warn' to continue in PyTorch (reported as not applied), or use_ort=False."
        )
    return (
        f"ORTModule failed on this model with an error it cannot fall back from ({type(e).__name__}: {first}). "
        "Train without ORT (use_ort=False), or report the model to ortlab with the saved graphs "
        "(ort_save_onnx_path=...)."
    )
