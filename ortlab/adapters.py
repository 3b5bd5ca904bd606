"""LoRA adapters through peft: train a few small matrices beside frozen weights instead of every weight.

LoRA (Hu et al., 2021) freezes the model and adds, next to chosen Linear layers W, a product B·A of two thin
matrices (rank r, scaled by alpha / r), initialised so that B·A = 0: the adapted model starts exactly where the
base model is. Only A and B (and a new task head, which must learn from scratch) train, so the optimizer holds
moments for ~1% of the parameters, and the run's result is a small adapter file that needs its base model.

Unlike the accelerations in `ortlab.accel`, an adapter *changes what is trained*; that is why it is its own
RunSpec field (`adapter`) and not part of `accel`. It still meets the accelerations (ORTModule exports the peft
model's graph, ZeRO shards only the adapter's optimizer state, torch.compile compiles it), so the mix rules in
`ortlab.accel.mix` know about it (`Mix.lora`).

Which layers: by default the attention projections the architecture names (`q_proj`/`k_proj`/`v_proj`/`o_proj`
in Llama-style models), else peft's table of target modules per model type; a model with neither gets an error
that lists its Linear layers, so the user can name `adapter.target_modules` themselves.
"""

from __future__ import annotations

from typing import Any

from ortlab.tasks import TASK_FEATURES, TASKS, ModelError, get_feature, get_task

# The four attention projections of Llama-style decoders (Llama, Mistral, Qwen2/3, SmolLM, Gemma, OLMo, ...) and
# of BART-style encoder-decoders. LoRA on all four learns more per parameter than q/v alone (QLoRA's finding,
# since made the default of most fine-tuning tools) at 2x the adapter's size, still ~1% of the model.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")

# peft's task types for ortlab's tasks (each record's `peft_task_type`): they decide which PeftModel class wraps the
# model, and so which head modules stay trainable (peft keeps `classifier`/`score` in modules_to_save for the
# classification types).
PEFT_TASK_TYPES = {name: t.peft_task_type for name, t in TASKS.items()}

# Task heads a classification model creates new (random) at load: they must train in full beside the adapter.
HEAD_NAMES = ("classifier", "score")

INSTALL_HINT = "pip install 'ortlab[llm]' (or pip install peft)"


class AdapterError(ModelError):
    """The adapter cannot be applied to this model; the message says why and what to set instead."""


def check_installed() -> None:
    from importlib.util import find_spec

    if find_spec("peft") is None:
        raise AdapterError(f"adapter.kind 'lora' needs the peft package, which is not installed: {INSTALL_HINT}")


def linear_names(model: Any) -> list[str]:
    """The distinct leaf names of the model's Linear-like layers (what `target_modules` can name)."""
    import torch

    names = set()
    for name, module in model.named_modules():
        # GPT-2 keeps its projections in transformers' Conv1D (a Linear with transposed weights); peft adapts both.
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def find_target_modules(model: Any) -> list[str]:
    """The Linear layers LoRA adapts by default in `model`: its attention projections, found by name."""
    present = set(linear_names(model))
    if set(ATTENTION_PROJECTIONS) <= present:
        return list(ATTENTION_PROJECTIONS)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    found = [m for m in PEFT_DEFAULTS.get(model_type, []) if m in present]
    if found:
        return found
    raise AdapterError(
        f"adapter.target_modules: ortlab does not know which layers of a {model_type!r} model to adapt; name them "
        f"in adapter.target_modules (its Linear layers: {', '.join(_shown(sorted(present)))})"
    )


def check_target_modules(model: Any, target_modules: list[str] | None, task: str | None = None) -> list[str]:
    """The target modules for `model` (found, or the user's, each checked to name a Linear layer of it).

    Every refusal lists the model's Linear layers, so the fix is in the message. For a classification task the
    head (`classifier`, `score`) is not offered: peft trains it in full (modules_to_save), and an adapter on the
    head alone adapts nothing (peft's NoMatchingPeftModuleError, after the model has loaded)."""
    if target_modules is None:
        return find_target_modules(model)
    present = set(linear_names(model))
    heads = set(HEAD_NAMES) & present if get_task(task).labels else set()
    body = sorted(present - heads)
    missing = [m for m in target_modules if m not in present]
    if missing:
        raise AdapterError(
            f"adapter.target_modules: {', '.join(repr(m) for m in missing)} "
            f"{'is not a Linear layer' if len(missing) == 1 else 'are not Linear layers'} of this model; its Linear "
            f"layers are: {', '.join(_shown(body))}"
        )
    if heads and set(target_modules) <= heads:
        raise AdapterError(
            f"adapter.target_modules: {', '.join(repr(m) for m in target_modules)} is the task head, which trains in "
            f"full beside the adapter anyway, so the adapter would adapt nothing; name layers of the model's body: "
            f"{', '.join(_shown(body))}"
        )
    return list(target_modules)


def _shown(names: list[str], limit: int = 40) -> list[str]:
    return names[:limit] + ([f"... ({len(names) - limit} more)"] if len(names) > limit else [])


def check_model(model_path: str, task: str, target_modules: list[str] | None, revision: str | None = None) -> list[str]:
    """Before any weight loads: build the model's skeleton on the meta device (no memory, no weights; well under a
    second) and check the target modules against it. Returns the target modules the run will adapt."""
    check_installed()
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_path, revision=revision)
    auto = getattr(transformers, get_feature(TASK_FEATURES[task]).auto_class)
    # The model class (and so its module) is imported here, outside the meta device: the first import of a
    # transformers modeling module imports torch._dynamo, which runs tensor code that fails on the meta device
    # ("Tensor.item() cannot be called on meta tensors", surfacing as a ModuleNotFoundError for the class).
    try:
        auto._model_mapping[type(config)]
    except KeyError:
        raise AdapterError(
            f"model.name: a {config.model_type!r} model has no {task} head in transformers ({auto.__name__}); "
            "choose a model with one, or another task"
        ) from None
    with torch.device("meta"):
        skeleton = auto.from_config(config)
    return check_target_modules(skeleton, target_modules, task)


def apply_lora(model: Any, adapter: Any, task: str) -> Any:
    """`model` wrapped in a peft `PeftModel` with a fresh LoRA adapter from `adapter` (an `AdapterSpec`).

    The base weights are frozen; the adapter's A/B matrices and a classification head (peft's modules_to_save for
    SEQ_CLS / TOKEN_CLS) train. The returned model is what the trainer trains and saves (adapter only).
    """
    check_installed()
    from peft import LoraConfig, get_peft_model

    targets = check_target_modules(model, adapter.target_modules, task)
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    classifies = get_task(task).labels is not None
    heads = [h for h in HEAD_NAMES if h in present] if classifies else []
    config = LoraConfig(
        task_type=PEFT_TASK_TYPES[task],
        r=adapter.rank,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=targets,
        modules_to_save=heads or None,
        # GPT-2's Conv1D stores its weight transposed; peft needs to know to adapt it as a Linear.
        fan_in_fan_out=getattr(getattr(model, "config", None), "model_type", None) == "gpt2",
    )
    return get_peft_model(model, config)


def is_adapter_model(model: Any) -> bool:
    return any(c.__name__ == "PeftModel" for c in type(model).__mro__)


def parameter_counts(model: Any) -> dict[str, int]:
    """Trainable and total parameters (a tied embedding counted once)."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return {"trainable": trainable, "total": total}


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of tensors the optimizer holds in its state (AdamW: two moments per trainable parameter, a step)."""
    inner = optimizer
    while getattr(inner, "optimizer", None) is not None and inner.optimizer is not inner:
        inner = inner.optimizer
    total = 0
    for state in getattr(inner, "state", {}).values():
        for value in state.values() if isinstance(state, dict) else ():
            if hasattr(value, "element_size") and hasattr(value, "numel"):
                total += value.element_size() * value.numel()
    return total


def adapter_summary(model: Any) -> dict[str, Any] | None:
    """What the run's adapter is (kind, rank, targets, base model), read from the peft model; None without one."""
    if not is_adapter_model(model):
        return None
    config = model.peft_config[model.active_adapter]
    return {
        "kind": "lora",
        "rank": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "target_modules": sorted(config.target_modules or []),
        "modules_to_save": sorted(config.modules_to_save or []),
        "task_type": str(getattr(config.task_type, "value", config.task_type)),
    }


def merge(model: Any) -> Any:
    """The base model with the adapter folded into its weights (W + B·A·alpha/r): a plain transformers model that
    runs without peft (for ONNX export, or to publish whole). Changes `model` in place."""
    return model.merge_and_unload()


def load_merged(adapter_dir: str, task: str, label_names: list[str] | None = None) -> Any:
    """Load a saved adapter folder onto its base model (named in its adapter_config.json) and merge it: the model
    an adapter run trained. The base loads through ortlab's task loader, so a classifier gets the run's labels."""
    check_installed()
    import json
    from pathlib import Path

    from peft import PeftModel

    from ortlab.tasks import load_model

    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
    base = load_model(config["base_model_name_or_path"], task, label_names or [], config.get("revision"))
    return merge(PeftModel.from_pretrained(base, adapter_dir))
