"""`ORTTrainer`: a `transformers.Trainer` that applies the acceleration mix and never pretends.

It overrides Trainer's seams only, never its training loop (Optimum's ORTTrainer copied ~470 lines of that
loop, broke with each transformers release, and was removed):

- `call_model_init`     checks and prepares every model Trainer builds from `model_init` (it trains that one).
- `_prepare_for_training` wraps the model Trainer is about to train in ORTModule, at the moment Trainer hands it
                        to Accelerate/DeepSpeed, so ORT composes with ZeRO and DDP; `self.model` stays the user's
                        model everywhere else (evaluation, saving, every look at its class or signature).
- `create_accelerator_and_postprocess` makes `accelerator.unwrap_model` see through ORTModule, so wherever
                        Trainer asks what model it trains (label smoothing's causal-LM shift, PEFT) it sees the
                        user's model, never the wrapper: ORT must not change what is trained.
- `create_optimizer`    picks the fused AdamW for `optim="adamw_ort_fused"` and records what was created.
- `training_step`       before ORT's first step, checks that the model's forward can be captured as a graph
                        (no Python side effects, no Python/NumPy randomness); counts samples/tokens/loss for the
                        per-step metrics; turns ORT failures into an error that says what to change.
- `_save`               saves the plain transformers model (never the ORTModule wrapper), plus the record of
                        what really applied, so `from_pretrained` loads the result and the record goes with it.

What really applied is verified after the first step and at the end (`trainer.accelerations`), written next to
each saved model (`ortlab_accelerations.json`) and to the metrics stream, and every acceleration that was asked
for but did not apply is reported with a warning and an error log line. That bookkeeping overrides nothing of
Trainer and lives in `ortlab.train.applied` (mixed in); this module holds the seams, and `ortlab.train.shardloader` the
training loader of a stream already split per process (`get_train_dataloader`). `AccelerationNotApplied`
and `ACCELERATIONS_FILE` are importable from here as before.
"""

from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any

from transformers import Trainer, TrainingArguments

from ortlab.accel import Applied, fused_adam, ort
from ortlab.tasks import TASKS
from ortlab.train import compat
from ortlab.train.applied import ACCELERATIONS_FILE, AccelerationNotApplied, RecomputeProbe, VerifiesAccelerations
from ortlab.train.args import ORT_FUSED, ORTTrainingArguments, checkpointing_requested
from ortlab.train.metricswriter import JsonLinesSink, StepMetricsCallback
from ortlab.train.sampler import lean_train_sampler
from ortlab.train.shardloader import OwnShardLoader

# The names scripts import from here; the warning and the file name are defined with the verification.
__all__ = ["ACCELERATIONS_FILE", "EVALUATE_ON", "AccelerationNotApplied", "ORTTrainer"]

EVALUATE_ON = "PyTorch (ORTModule trains; evaluate, predict and generate run the same weights in PyTorch)"


class ORTTrainer(VerifiesAccelerations, OwnShardLoader, Trainer):
    """Drop-in for Optimum's `ORTTrainer`: `ORTTrainer(model=..., args=ORTTrainingArguments(...), ...,
    feature="sequence-classification")`.

    `feature` names the model's task head (see `ortlab.tasks`); it is checked against the model and recorded.
    `on_metrics`, if given, receives every metrics record (a dict) as it is written. Optimum's keywords that
    transformers 5 renamed (`tokenizer=`) are accepted with a warning (see `ortlab.train.compat`).
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
        if len(positional) > 5:
            # Up to model_init, Optimum's order is transformers 5's (tokenizer sits where processing_class does);
            # after it, transformers 5 put compute_loss_func where Optimum had compute_metrics: a metrics function
            # passed by position would silently become the loss.
            raise TypeError(
                "ORTTrainer takes at most 7 positional arguments (model, args, data_collator, train_dataset, "
                "eval_dataset, tokenizer/processing_class, model_init): pass compute_metrics and the rest by keyword, "
                "since Optimum's order and transformers 5's differ from there on"
            )
        args = _as_ort_args(args, self._args_class)
        kwargs = compat.translate_trainer_kwargs(kwargs)
        self.feature = feature
        # Whether evaluations report exp(eval loss): a language model's head (a run sets its task's `perplexity`).
        self.perplexity = any(t.perplexity and t.feature.name == feature for t in TASKS.values())
        self._model_changes: dict[str, str] = {}
        # Trainer.__init__ sets config.use_cache = args.use_cache (False) for good, and ORT needs it off too; the
        # saved model gets the user's value back (a causal LM must keep generating with its KV cache).
        self._user_use_cache: bool | None = None
        self._ort_module: Any = None
        self._forward_checked = False
        self._inference_note_given = False
        if model is not None:
            self._adopt(model, args)
        super().__init__(model, args, *positional, **kwargs)
        if self.model_accepts_loss_kwargs and not _loss_uses_num_items(self.model):
            # transformers decides from `**kwargs` in forward() that the model divides its loss by the number of
            # label tokens in the whole (multi-process) batch, and then multiplies the loss by the number of
            # processes. Classification heads take a plain mean instead, so with N processes their loss and
            # gradients came out N times too large. Only models that pass **kwargs on to their loss honour it.
            self.model_accepts_loss_kwargs = False
        self.accelerations: dict[str, Applied] = {
            name: Applied(name, requested) for name, requested in args.mix.requested().items()
        }
        if args.use_ort:
            # Say what evaluate/predict run on: ORTModule is a training engine; evaluation and prediction (and
            # generation) run in PyTorch on the same weights, as Optimum's did by default.
            self.accelerations["ort"].details["evaluate_predict"] = EVALUATE_ON
        if self._model_changes:
            self.accelerations["ort"].details["model_changes"] = dict(self._model_changes)
        self._reported: set[str] = set()
        # Trainable / total parameters and the optimizer's state in bytes, measured after the first step (see
        # _record_parameters): what an adapter saves, in numbers.
        self.parameters_record: dict[str, Any] | None = None
        self._precision_probe: Any = None
        self._recompute_probe: Any = None  # (applied.RecomputeProbe, with activation checkpointing, for one step)
        self._step_counters: dict[str, float] = {"samples": 0, "tokens": 0, "loss": 0.0, "flops": 0.0}
        self._shape: Any = False  # ortlab.flops.ModelShape, None when it cannot be counted; False: not yet counted
        # Never into output_dir (transformers' own tests count what is there): the run folder's file, logging_dir,
        # or memory (see ORTTrainingArguments.metrics_file).
        path = args.metrics_file
        self.metrics_sink = JsonLinesSink(path, also=on_metrics, keep=path is None and args.metrics_path is None)
        self.step_metrics = StepMetricsCallback(self, self.metrics_sink)
        self.add_callback(self.step_metrics)

    _args_class: type = ORTTrainingArguments

    @property
    def metrics_records(self) -> list[dict[str, Any]]:
        """The metrics stream's records, kept in memory when no file receives them (no metrics_path, no
        logging_dir); empty when a file does (read that file) or the stream is off (metrics_path='')."""
        return self.metrics_sink.records

    @staticmethod
    def get_ort_optimizer_cls_and_kwargs(args: TrainingArguments) -> tuple[type, dict[str, Any]]:
        """Optimum's API: ONNX Runtime's optimizer class and its keyword arguments for `optim="adamw_ort_fused"`.

        Returns ORT's `FusedAdam` (CUDA-only) with lr, betas and eps from `args`, as Optimum's did, and the
        AdamW mode ortlab uses (decoupled weight decay, as torch.optim.AdamW). The trainer itself decides what
        runs: where FusedAdam cannot (on a CPU), it builds torch's fused AdamW and records that in
        `trainer.accelerations["fused_adam"]`.
        """
        wanted = getattr(args, "fused_adam", False) or str(getattr(args.optim, "value", args.optim)) == ORT_FUSED
        if not wanted:
            raise ValueError(
                f"get_ort_optimizer_cls_and_kwargs knows one optimizer, optim={ORT_FUSED!r}; got optim={args.optim!r}"
            )
        try:
            from onnxruntime.training.optim import AdamWMode, FusedAdam
        except ImportError as e:
            raise ImportError(f"ONNX Runtime's FusedAdam needs onnxruntime-training: {ort.INSTALL_HINT}") from e
        kwargs = {
            "lr": args.learning_rate,
            "betas": (args.adam_beta1, args.adam_beta2),
            "eps": args.adam_epsilon,
            "adam_w_mode": AdamWMode.ADAMW_TORCH,
        }
        return FusedAdam, kwargs

    # --- seams ---------------------------------------------------------------------------------------------

    def _adopt(self, model: Any, args: TrainingArguments) -> None:
        """Check and prepare a model this trainer will train (the one given, or one built by model_init)."""
        if self.feature is not None:
            compat.check_feature(model, self.feature)
        self._user_use_cache = getattr(getattr(model, "config", None), "use_cache", None)
        if getattr(args, "use_ort", False):
            changes = ort.prepare_model(model)
            self._model_changes.update(changes)
            if changes and hasattr(self, "accelerations"):
                self.accelerations["ort"].details.setdefault("model_changes", {}).update(changes)

    def call_model_init(self, trial: Any = None) -> Any:
        # Trainer builds a fresh model from model_init in __init__ and again at the start of every train(), and
        # trains, keeps and saves that one: check and prepare each.
        model = super().call_model_init(trial)
        self._adopt(model, self.args)
        return model

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        # Trainer asks `accelerator.unwrap_model(model)` what model it trains: the label smoother shifts labels
        # only when that model's class is a causal LM, PEFT models are told apart the same way. Under ORT the
        # answer would be the ORTModule wrapper, and a causal LM with label smoothing would silently train on
        # unshifted labels. Unwrapping ORTModule here makes every such question see the user's model.
        unwrap = self.accelerator.unwrap_model

        def unwrap_model(model: Any, *args: Any, **kwargs: Any) -> Any:
            return _unwrap_ort(unwrap(model, *args, **kwargs))

        self.accelerator.unwrap_model = unwrap_model

    def train(self, *args: Any, **kwargs: Any):
        try:
            return super().train(*args, **kwargs)
        finally:
            self.metrics_sink.close()

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        # The same order as transformers' and accelerate's, without their list of every index (ortlab.train.sampler).
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return lean_train_sampler(super()._get_train_sampler(train_dataset), dataset, self.args)

    def _prepare_for_training(self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: Any):
        if not self.args.use_ort:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        plain = self.model  # the model Trainer trains: the one given, or the one model_init just built
        if self._ort_module is None or self._ort_module.module is not plain:
            self._ort_module = ort.wrap(plain, self.args.ort_options)
            self._forward_checked = False
        # Trainer hands `self.model` to Accelerate/DeepSpeed only when the model it is about to train *is*
        # self.model: for the length of this call, it is the ORTModule. Afterwards `self.model` is the user's model
        # again (as Trainer documents it), and `self.model_wrapped` (ORTModule, or DeepSpeed/DDP around it) trains.
        self.model = self.model_wrapped = self._ort_module
        try:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        finally:
            self.model = plain
            self.callback_handler.model = plain

    def create_optimizer(self, model: Any = None):
        if self.optimizer is None and self.args.fused_adam and self.optimizer_cls_and_kwargs is None:
            cls, extra, _ = fused_adam.optimizer_cls_and_kwargs(self.args.device.type, with_ort=self.args.use_ort)
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
        # Not under torch.compile: hooks added and removed around the first step would make Inductor recompile.
        if self._precision_probe is None and self.state.global_step == 0 and not self.args.torch_compile:
            from ortlab.accel.precision import PrecisionWatch

            self._precision_probe = PrecisionWatch(self.model)  # removed after the first step (_verify_precision)
            if checkpointing_requested(self.args):
                self._recompute_probe = RecomputeProbe(self.model)  # (_verify_gradient_checkpointing removes it)
        if self._ort_module is not None and not self._forward_checked:
            self._forward_checked = True
            if self.args.ort_check_forward:
                self._check_forward_is_capturable(inputs, num_items_in_batch)
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)
        except Exception as e:
            if self._ort_module is not None and ort.is_ort_error(e):
                raise ort.ORTFallbackError(_ort_failure_message(e, self.args.ort_fallback)) from e
            raise
        self._step_counters["loss"] += float(loss)
        return loss

    def _check_forward_is_capturable(self, inputs: dict[str, Any], num_items_in_batch: Any) -> None:
        """ORTModule runs the model's Python `forward` only while exporting it; what Python does there (change
        a buffer or attribute, draw from `random` or NumPy) is frozen into the graph. Run one eager forward on
        the first batch first, undo everything it did, and fall back (or fail) if it did any of that."""
        plain = self._ort_module.module
        call = dict(inputs)
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            call["num_items_in_batch"] = num_items_in_batch
        record = self.accelerations["ort"]
        try:
            with self.compute_loss_context_manager():
                problems = ort.python_effects_of_forward(plain, call)
        except Exception as e:  # a subclass may feed the model differently: the check must not stop training
            record.details["forward_check"] = f"skipped: the eager forward failed ({ort.describe_error(e)[:300]})"
            return
        record.details["forward_check"] = "passed" if not problems else "failed"
        if not problems:
            return
        reason = (
            "the model's forward "
            + "; ".join(problems)
            + (": ONNX Runtime would run the values of its first call at every step (a graph cannot hold Python)")
        )
        record.details["forward_problems"] = problems
        if self.args.ort_fallback == "error":
            raise ort.ORTFallbackError(
                f"ORTModule cannot train this model as PyTorch does: {reason}. ort_fallback='error' is set; set "
                "ort_fallback='warn' to train in PyTorch instead (reported as not applied), or use_ort=False, or "
                "move the Python side effect / randomness out of forward (torch.rand draws are fine); if the effect is "
                "harmless, ort_check_forward=False."
            )
        ort.force_fallback(self._ort_module, reason)

    def evaluate(self, *args: Any, inference_with_ort: bool = False, **kwargs: Any) -> dict[str, float]:
        self._note_inference_with_ort(inference_with_ort)
        if self.is_deepspeed_enabled and self.deepspeed is None and self.args.zero_stage < 3:
            # Before training, transformers evaluates a DeepSpeed model by starting a DeepSpeed inference engine,
            # which only exists for ZeRO-3. Stages 1 and 2 leave the parameters whole: evaluate the plain model.
            self.is_deepspeed_enabled = False
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                self.is_deepspeed_enabled = True
        return super().evaluate(*args, **kwargs)

    def predict(self, *args: Any, inference_with_ort: bool = False, **kwargs: Any):
        self._note_inference_with_ort(inference_with_ort)
        return super().predict(*args, **kwargs)

    def _note_inference_with_ort(self, asked: bool) -> None:
        if asked and not self._inference_note_given:
            self._inference_note_given = True
            warnings.warn(
                "ortlab: inference_with_ort=True (Optimum) is accepted, but ortlab evaluates and predicts in "
                "PyTorch on the trained weights; for ONNX Runtime inference export the model (ortlab.export, "
                "`ortlab export RUN`), which checks its parity with PyTorch",
                compat.OptimumCompatWarning,
                stacklevel=3,
            )

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
        # The record of what applied goes with every saved model (checkpoints and save_model), not loose in
        # output_dir, where scripts that list checkpoints expect only what Trainer writes.
        self._write_accelerations(output_dir or self.args.output_dir)

    # --- what each step processed (the per-step metrics) ----------------------------------------------------

    def _reset_step_counters(self) -> None:
        self._step_counters = {"samples": 0, "tokens": 0, "loss": 0.0, "flops": 0.0}

    def _step_extras(self) -> dict[str, float]:
        """A subclass's own numbers for each step record (the preference trainer's rewards): none here."""
        return {}

    def _model_shape(self) -> Any:
        """The model's parameter counts for the FLOP formula (ortlab.flops), counted once, on the model that trains."""
        if self._shape is False:
            from ortlab.flops import count_parameters

            self._shape = count_parameters(_unwrap_ort(self.model))
        return self._shape

    def _count_inputs(self, inputs: dict[str, Any]) -> None:
        ids = inputs.get("input_ids")
        mask = inputs.get("attention_mask")
        first = ids if ids is not None else next((v for v in inputs.values() if hasattr(v, "shape")), None)
        if first is not None and len(first.shape) > 0:
            self._step_counters["samples"] += int(first.shape[0])
            shape = self._model_shape()
            if shape is not None and len(first.shape) > 1:
                from ortlab.flops import flops_per_sample

                # The padded length: the GPU computes on padding too.
                self._step_counters["flops"] += int(first.shape[0]) * flops_per_sample(shape, int(first.shape[-1]))
        if mask is not None:
            self._step_counters["tokens"] += int(mask.sum())
        elif ids is not None:
            self._step_counters["tokens"] += int(ids.numel())


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


def _as_ort_args(args: TrainingArguments | None, cls: type = ORTTrainingArguments) -> ORTTrainingArguments:
    if args is None:
        return cls(output_dir="ortlab_output")
    if isinstance(args, cls):
        return args
    # Another TrainingArguments (plain, or Seq2Seq's): keep every value the user set, add ortlab's defaults (ORT on).
    names = {f.name for f in fields(cls) if f.init}
    values = {f.name: getattr(args, f.name) for f in fields(type(args)) if f.init and f.name in names}
    return cls(**values)


def _ort_failure_message(e: BaseException, policy: str) -> str:
    # The whole error: ORT's first line is often only "There was an error while exporting the PyTorch model to
    # ONNX:", and the operator that failed comes after it.
    what = ort.describe_error(e)
    if policy == "error":
        return (
            "ORTModule could not train this model and ort_fallback='error' is set. "
            "Set ort_fallback='warn' to continue in PyTorch (reported as not applied), or use_ort=False.\n" + what
        )
    return (
        "ORTModule failed on this model with an error it cannot fall back from. "
        "Train without ORT (use_ort=False), or report the model to ortlab with the saved graphs "
        "(ort_save_onnx_path=...).\n" + what
    )
