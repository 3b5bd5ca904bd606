"""Model heads (Optimum called them `feature`s): which head a run trains, and how to find and load its model.

In ortlab a feature names the task head of the model: `ORTTrainer(..., feature="sequence-classification")`
checks that the model really has that head (a mismatch fails before training, not after an hour), and the
feature is recorded with the run so that export and the model card know what the model does.
"""

from __future__ import annotations

from typing import Any

from ortlab.assets import embedded_model_path
from ortlab.errors import OrtlabError
from ortlab.hub import HubUnavailable, hub_repo_exists
from ortlab.tasks.registry import TASKS, get_task
from ortlab.tasks.task import Feature

# The heads of ortlab's tasks (each task's record names its own), and two more that ORTTrainer checks for a model a
# user brings (`ORTTrainer(..., feature="masked-lm")`).
FEATURES = {
    f.name: f
    for f in (
        *(t.feature for t in TASKS.values()),
        Feature("masked-lm", "AutoModelForMaskedLM", ("ForMaskedLM",)),
        Feature("question-answering", "AutoModelForQuestionAnswering", ("ForQuestionAnswering",)),
    )
}


def get_feature(name: str) -> Feature:
    try:
        return FEATURES[name]
    except KeyError:
        raise ValueError(f"unknown feature {name!r}: choose one of {', '.join(FEATURES)}") from None


def check_model_matches(model: object, name: str) -> None:
    """Fail early when a transformers model's head is not the one the feature names."""
    feature = get_feature(name)
    cls = type(model).__name__
    is_transformers = any(c.__module__.startswith("transformers.") for c in type(model).__mro__)
    if is_transformers and not cls.endswith(feature.head_suffix):
        raise ValueError(
            f"feature={name!r} needs a model with a *{feature.head_suffix[0]} head, but got {cls}: load the model "
            f"with {feature.auto_class}.from_pretrained(...) or pass the matching feature"
        )


# --- models for a RunSpec ----------------------------------------------------------------------------------------


class ModelError(OrtlabError, ValueError):
    """The model cannot be used; the message says what is wrong and how to fix it."""


def _check_config(config_file: Any) -> None:
    """A model folder's config.json must be a JSON object naming a model type transformers knows: a broken one
    is reported here, with the file and the fix, not as a traceback from deep inside transformers."""
    import json

    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(
            f"model.name: {config_file} is not valid JSON ({e}); restore it (save the model again, or copy the "
            "folder again from where it came from)"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelError(
            f"model.name: {config_file} has no 'model_type' field, so transformers cannot tell which architecture "
            "to build; restore the file from the original model"
        )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if config["model_type"] not in CONFIG_MAPPING_NAMES:
        raise ModelError(
            f"model.name: {config_file} names model_type {config['model_type']!r}, which this transformers does "
            "not know; fix the field, or upgrade transformers if the architecture is newer"
        )


def resolve_model(name: str, build: bool = True) -> str:
    """A local folder for `name`: a folder the user named, ortlab's packaged copy of a Hub id, or the Hub id
    itself when it exists on a reachable Hub (checked fast; nothing is downloaded here). With `build=False` a
    packaged copy that must first be made (the embedded LLM, converted from GGUF once) is named, not made: the
    data is checked before that cost."""
    import os
    from pathlib import Path

    path = Path(os.path.expanduser(name))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"model.name: the folder {name!r} has no config.json: is it a Hugging Face model folder?")
        _check_config(path / "config.json")
        return str(path)
    if path.is_file():
        # A weights file (.safetensors, .bin, .gguf ...) is not a model: the config and tokenizer live beside it.
        what = "a GGUF file, which ortlab does not load directly" if path.suffix.lower() == ".gguf" else "a file"
        raise ModelError(
            f"model.name: {name!r} is {what}; name the Hugging Face model folder instead (config.json, the weights "
            "and the tokenizer files together, as save_pretrained writes them)"
        )
    embedded = embedded_model_path(name, build=build)
    if embedded is not None:
        return str(embedded)
    if name.startswith((".", "/", "~")) or path.suffix:
        raise ModelError(f"model.name: the folder {name!r} does not exist")
    try:
        exists = hub_repo_exists(name, "model")
    except HubUnavailable as e:
        raise ModelError(
            f"model.name: {name!r} is not a local folder and the Hugging Face Hub is not reachable ({e}). "
            "Use a local model folder or the embedded sentence-transformers/all-MiniLM-L6-v2, or go online."
        ) from None
    if not exists:
        raise ModelError(f"model.name: no model {name!r} on the Hugging Face Hub (check the id)")
    return name


# ortlab task -> the name of its head (kept for callers of the old table; each task's record has it: `.feature`)
TASK_FEATURES = {name: t.feature.name for name, t in TASKS.items()}

# transformers' tables of model types per head (transformers.models.auto.modeling_auto), by ortlab task
HEAD_TABLES = {name: t.head_table for name, t in TASKS.items() if t.head_table is not None}


def check_model_fits_task(path: str, task: str) -> None:
    """The model must have a head for the task: said from the model folder's config.json (plain JSON, no weights),
    not by a transformers error after the weights have loaded (or, for a LoRA run, a traceback from peft). A
    seq2seq run needs an encoder-decoder model: transformers writes `is_encoder_decoder: true` into the config of
    every one (T5, BART, Marian, ...). A Hub id not downloaded yet is checked when it loads."""
    import json
    from pathlib import Path

    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))  # valid: resolve_model checked it
    model_type = config.get("model_type")
    if get_task(task).head_table is not None:
        import transformers.models.auto.modeling_auto as tables

        fitting = [t for t, table in HEAD_TABLES.items() if model_type in getattr(tables, table)]
        if task not in fitting:
            raise ModelError(
                f"model.name: a {model_type!r} model has no {task} head in transformers, so it cannot be trained "
                "for that task; choose a model that has one, or a task this model has a head for "
                f"({', '.join(fitting) or 'none that ortlab trains'})"
            )
        return
    if not config.get("is_encoder_decoder", False):
        raise ModelError(
            f"model.name: task {task} needs an encoder-decoder model (T5, BART, Marian, mT5, Pegasus, ...), but "
            f"{path!r} is a {config.get('model_type')!r} model without a decoder of its own; choose an encoder-decoder "
            "model, or a task this model has a head for (sequence-classification, token-classification, causal-lm)"
        )


def load_tokenizer(path: str, revision: str | None = None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    if tokenizer.pad_token is None:
        # Decoder tokenizers (GPT-2 style) have no pad token; padding with EOS is the usual convention.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str, task: str, label_names: list[str], revision: str | None = None, pad_token_id: int | None = None
):
    """The model with the head for `task`; classification heads sized for `label_names` (a pretrained head of
    another size is replaced, which transformers 5 only does with ignore_mismatched_sizes).

    `pad_token_id` (the tokenizer's) goes into a config that has none: a decoder classifier (GPT-2, Llama) finds
    each row's last real token by it, and without one refuses any batch of more than one row after the model has
    loaded ("Cannot handle batch sizes > 1 if no padding token is defined")."""
    import transformers

    feature = get_task(task).feature
    auto = getattr(transformers, feature.auto_class)
    kw: dict = {"revision": revision}
    if pad_token_id is not None and label_names:
        config = transformers.AutoConfig.from_pretrained(path, revision=revision)
        if getattr(config, "pad_token_id", None) is None:
            kw["pad_token_id"] = pad_token_id
    if label_names:
        kw.update(
            num_labels=len(label_names),
            id2label=dict(enumerate(label_names)),
            label2id={n: i for i, n in enumerate(label_names)},
            ignore_mismatched_sizes=True,
        )
    return auto.from_pretrained(path, **kw)
