"""What Optimum-era training scripts pass, translated for transformers 5.

Optimum removed its ONNX Runtime trainer in v2.0, and transformers 5 removed or renamed a few dozen
`TrainingArguments` fields that such scripts still carry. Each removed field is mapped here to what it means in
transformers 5 (with one warning naming the new spelling), or, where transformers 5 has no such setting, accepted
with one warning saying that it has no effect. Nothing here reaches into transformers: it only rewrites keyword
arguments before `TrainingArguments.__init__` sees them, so a script fails neither with a `TypeError` from inside
transformers nor silently.

The mapping is data (`RENAMED`, `TRANSLATED`, `NO_EFFECT`) so that the migration guide and its test can list it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ortlab.tasks import check_model_matches


class OptimumCompatWarning(FutureWarning):
    """An Optimum-era / transformers-4 argument was translated or ignored: the message says how to spell it now."""


class ORTOptimizerNames(str, Enum):
    """Optimum's names for ONNX Runtime's optimizers (`optim=ORTOptimizerNames.ADAMW_ORT_FUSED` works as the string)."""

    ADAMW_ORT_FUSED = "adamw_ort_fused"


# old field -> transformers-5 field, same value
RENAMED: dict[str, str] = {
    "evaluation_strategy": "eval_strategy",
    "no_cuda": "use_cpu",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "per_gpu_eval_batch_size": "per_device_eval_batch_size",
    "push_to_hub_token": "hub_token",
    "torchdynamo": "torch_compile_backend",
    # Optimum's ORTTrainingArguments spelling of ortlab's ORT options
    "onnx_log_level": "ort_log_level",
}

# old field -> how it is expressed now (the function returns the transformers-5 keyword arguments)
TRANSLATED: dict[str, tuple[str, Any]] = {
    "warmup_ratio": ("warmup_steps=<ratio> (a float below 1 is a ratio of all steps)", lambda v: {"warmup_steps": v}),
    "adafactor": ("optim='adafactor'", lambda v: {"optim": "adafactor"} if v else {}),
    "group_by_length": (
        "train_sampling_strategy='group_by_length'",
        lambda v: {"train_sampling_strategy": "group_by_length"} if v else {},
    ),
    "include_inputs_for_metrics": (
        "include_for_metrics=['inputs']",
        lambda v: {"include_for_metrics": ["inputs"]} if v else {},
    ),
    "include_tokens_per_second": (
        "include_num_input_tokens_seen=True",
        lambda v: {"include_num_input_tokens_seen": True} if v else {},
    ),
    "split_batches": (
        "accelerator_config={'split_batches': ...}",
        lambda v: {"accelerator_config": {"split_batches": v}},
    ),
    "dispatch_batches": (
        "accelerator_config={'dispatch_batches': ...}",
        lambda v: {"accelerator_config": {"dispatch_batches": v}},
    ),
    "fsdp_min_num_params": ("fsdp_config={'min_num_params': ...}", lambda v: {"fsdp_config": {"min_num_params": v}}),
    "fsdp_transformer_layer_cls_to_wrap": (
        "fsdp_config={'transformer_layer_cls_to_wrap': ...}",
        lambda v: {"fsdp_config": {"transformer_layer_cls_to_wrap": v}},
    ),
    "push_to_hub_model_id": ("hub_model_id", lambda v: {"hub_model_id": v}),
}

# old field -> why it has no effect now (accepted, one warning; the value stays readable as an attribute)
NO_EFFECT: dict[str, str] = {
    "logging_dir": "transformers 5 reads TensorBoard's folder from the TENSORBOARD_LOGGING_DIR environment variable; "
    "ortlab sets that variable from logging_dir unless it is set already",
    "overwrite_output_dir": "transformers 5 always writes into output_dir (resume with "
    "train(resume_from_checkpoint=...))",
    "save_safetensors": "transformers 5 always saves safetensors",
    "fp16_backend": "transformers 5 has one mixed-precision backend (torch autocast)",
    "half_precision_backend": "transformers 5 has one mixed-precision backend (torch autocast)",
    "fp16_opt_level": "apex AMP is gone from transformers 5 (torch autocast is used)",
    "use_mps_device": "transformers 5 picks Apple's MPS device by itself",
    "use_ipex": "Intel's extension is gone from transformers 5",
    "jit_mode_eval": "TorchScript evaluation is gone from transformers 5",
    "tpu_num_cores": "set TPU cores with the launcher",
    "tpu_metrics_debug": "gone from transformers 5",
    "mp_parameters": "SageMaker model parallel parameters are gone from transformers 5",
    "ray_scope": "gone from transformers 5",
    "past_index": "gone from transformers 5 (models return their cache themselves)",
    "use_legacy_prediction_loop": "transformers 5 has one evaluation loop",
    "push_to_hub_organization": "give hub_model_id as 'organization/name'",
    # Optimum's ORTTrainingArguments
    "use_module_with_loss": "ortlab's ORTModule graph already holds the loss of transformers models (they compute "
    "it in forward when labels are given); with label smoothing or compute_loss_func the loss is computed in PyTorch "
    "from the logits, as transformers.Trainer does",
}

# Optimum's ORTTrainer keywords that transformers 5's Trainer does not take
TRAINER_RENAMED = {"tokenizer": "processing_class"}
TRAINER_NO_EFFECT = {
    "onnx_model_path": "ortlab evaluates and predicts in PyTorch; for an ONNX model of the result use "
    "ortlab.export (or `ortlab export RUN`), which also checks its parity with PyTorch",
}


# Optimum's feature names that ortlab.tasks does not list (Optimum used them to pick an ONNX export for
# evaluation): "-with-past" only asked for a KV cache in that export.
FEATURES_WITHOUT_HEAD = ("default", "feature-extraction")
SEQ2SEQ_FEATURES = ("seq2seq-lm",)


def check_feature(model: Any, feature: str) -> str:
    """Check `feature` against the model as ortlab.tasks does, knowing Optimum's names too; return the name kept."""

    name = feature.removesuffix("-with-past")
    if name in FEATURES_WITHOUT_HEAD:
        return name
    if name in SEQ2SEQ_FEATURES:
        config = getattr(model, "config", None)
        if config is not None and not getattr(config, "is_encoder_decoder", False):
            raise ValueError(
                f"feature={feature!r} needs an encoder-decoder model (T5, BART, ...), but got {type(model).__name__}: "
                "load it with AutoModelForSeq2SeqLM.from_pretrained(...) or pass the matching feature"
            )
        return name
    check_model_matches(model, name)
    return name


def _removed(help_text: str = "", default: Any = None) -> Any:
    return field(
        default=default,
        metadata={
            "help": "Removed in transformers 5; accepted for Optimum-era scripts (see "
            "docs/guide/migrating-from-optimum.md). " + help_text
        },
    )


@dataclass
class OptimumEraFields:
    """The removed fields as dataclass fields (default None: not given), so that `HfArgumentParser`, which Optimum's
    example scripts use, accepts `--logging_dir`, `--evaluation_strategy`, `--overwrite_output_dir`, ... on the
    command line. `accepts_optimum_era_arguments` translates them before transformers sees them."""

    evaluation_strategy: str | None = _removed("Use eval_strategy.")
    no_cuda: bool = _removed("Use use_cpu.", False)
    per_gpu_train_batch_size: int | None = _removed("Use per_device_train_batch_size.")
    per_gpu_eval_batch_size: int | None = _removed("Use per_device_eval_batch_size.")
    push_to_hub_token: str | None = _removed("Use hub_token.")
    torchdynamo: str | None = _removed("Use torch_compile_backend.")
    onnx_log_level: str | None = _removed("Optimum's name of ort_log_level.")
    warmup_ratio: float | None = _removed("Use warmup_steps (a float below 1 is a ratio).")
    adafactor: bool = _removed("Use optim='adafactor'.", False)
    group_by_length: bool = _removed("Use train_sampling_strategy='group_by_length'.", False)
    include_inputs_for_metrics: bool = _removed("Use include_for_metrics=['inputs'].", False)
    include_tokens_per_second: bool = _removed("Use include_num_input_tokens_seen.", False)
    split_batches: bool = _removed("Use accelerator_config.", False)
    dispatch_batches: bool | None = _removed("Use accelerator_config.")
    fsdp_min_num_params: int | None = _removed("Use fsdp_config.")
    fsdp_transformer_layer_cls_to_wrap: str | None = _removed("Use fsdp_config.")
    push_to_hub_model_id: str | None = _removed("Use hub_model_id.")
    logging_dir: str | None = _removed("TensorBoard's folder: TENSORBOARD_LOGGING_DIR.")
    overwrite_output_dir: bool = _removed("No effect.", False)
    save_safetensors: bool | None = _removed("No effect.")
    fp16_backend: str | None = _removed("No effect.")
    half_precision_backend: str | None = _removed("No effect.")
    fp16_opt_level: str | None = _removed("No effect.")
    use_mps_device: bool = _removed("No effect.", False)
    use_ipex: bool = _removed("No effect.", False)
    jit_mode_eval: bool = _removed("No effect.", False)
    tpu_num_cores: int | None = _removed("No effect.")
    tpu_metrics_debug: bool = _removed("No effect.", False)
    mp_parameters: str | None = _removed("No effect.")
    ray_scope: str | None = _removed("No effect.")
    past_index: int | None = _removed("No effect.")
    use_legacy_prediction_loop: bool = _removed("No effect.", False)
    push_to_hub_organization: str | None = _removed("No effect.")
    use_module_with_loss: bool = _removed("Optimum's; no effect (the loss is in the ORT graph already).", False)


def _warn(message: str) -> None:
    warnings.warn(f"ortlab: {message}", OptimumCompatWarning, stacklevel=4)


def _merge(into: dict[str, Any], key: str, value: Any, defaults: dict[str, Any]) -> None:
    if isinstance(value, dict) and isinstance(into.get(key), dict):
        into[key] = {**into[key], **value}
    elif key in into and into[key] != value and into[key] != defaults.get(key, object()):
        raise TypeError(f"{key}={into[key]!r} was given, and also an older argument that means {key}={value!r}")
    else:
        into[key] = value  # (a value equal to the field's default is what HfArgumentParser passes when not given)


def translate_training_kwargs(
    kwargs: dict[str, Any], defaults: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rewrite Optimum-era / transformers-4 `TrainingArguments` keywords for transformers 5.

    Returns (keywords for transformers 5, the old keywords that have no effect, kept to be set as attributes).
    Each translated or ignored keyword warns once, naming the new spelling or saying why it has no effect.
    `defaults` (field -> default) lets an old spelling win over a new one that only holds its default.
    """
    defaults = defaults or {}
    out = {k: v for k, v in kwargs.items() if k not in RENAMED and k not in TRANSLATED and k not in NO_EFFECT}
    ignored: dict[str, Any] = {}
    for old, value in kwargs.items():
        if value is None or (value is False and isinstance(getattr(OptimumEraFields, old, None), bool)):
            continue  # not given (HfArgumentParser passes every field, with its default: None, or False for flags)
        if old in RENAMED:
            new = RENAMED[old]
            _warn(f"`{old}` is spelled `{new}` now; using {new}={value!r}")
            _merge(out, new, value, defaults)
        elif old in TRANSLATED:
            spelling, translate = TRANSLATED[old]
            _warn(f"`{old}` was removed in transformers 5; using {spelling}")
            for key, new_value in translate(value).items():
                _merge(out, key, new_value, defaults)
        elif old == "logging_dir":
            ignored[old] = value
            if value is not None:
                current = os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(value))
                done = "set it" if current == str(value) else f"it is already set, to {current!r}, and stays"
                _warn(
                    "`logging_dir` was removed in transformers 5, which reads TensorBoard's folder from the "
                    f"TENSORBOARD_LOGGING_DIR environment variable: ortlab {done}"
                )
        elif old in NO_EFFECT:
            ignored[old] = value
            _warn(f"`{old}` is accepted but has no effect here: {NO_EFFECT[old]}")
    if "optim" in out and str(getattr(out["optim"], "value", out["optim"])) == "adamw_hf":
        _warn("optim='adamw_hf' (transformers' own AdamW) is gone from transformers 5; using optim='adamw_torch'")
        out["optim"] = "adamw_torch"
    elif isinstance(out.get("optim"), ORTOptimizerNames):
        out["optim"] = out["optim"].value
    return out, ignored


def translate_trainer_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Rewrite Optimum's `ORTTrainer(...)` keywords for transformers 5's `Trainer` (tokenizer -> processing_class)."""
    out = dict(kwargs)
    for old, new in TRAINER_RENAMED.items():
        if old in out:
            value = out.pop(old)
            if out.get(new) is not None and value is not None and out[new] is not value:
                raise TypeError(f"both {old}= and {new}= were given: pass only {new}= (transformers 5's name)")
            if value is not None:
                out[new] = value
            _warn(f"`{old}=` is called `{new}=` in transformers 5; passing it as {new}")
    for old, why in TRAINER_NO_EFFECT.items():
        if old in out:
            out.pop(old)
            _warn(f"`{old}=` is accepted but has no effect: {why}")
    return out


def accepts_optimum_era_arguments(cls: type) -> type:
    """Class decorator for a `TrainingArguments` dataclass: its `__init__` takes the removed fields as well.

    Applied after `@dataclass` (which writes `__init__`), so every dataclass subclass needs it again.
    """
    import dataclasses

    generated = cls.__init__
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs, ignored = translate_training_kwargs(kwargs, defaults)
        generated(self, *args, **kwargs)
        for name, value in ignored.items():
            # Scripts read some of them back (args.logging_dir): they stay readable, with the value given.
            object.__setattr__(self, name, value)

    __init__.__doc__ = generated.__doc__
    __init__.__wrapped__ = generated  # inspect.signature shows the dataclass fields
    cls.__init__ = __init__
    return cls
