"""What a task is: one record (`Task`) that says everything that varies between tasks, which the rest of ortlab asks
instead of comparing a task's name with a string.

A record holds plain values (the model head, the data it reads, which scores and generations apply, the spec
fields the forms show) and, for what needs torch, datasets or the trainer, the *path* of the function or class in
the layer that may import them ("ortlab.data.inputs:sequence_rows"). This layer sits below the spec (standard
library only), so the spec, the data checks and the forms can read a record; the behaviour named by path is
resolved (`Task.part`) by the code that calls it, which is in a layer above it. `ortlab.toggles` solved the same
problem for the accelerations this way (`Toggle.availability`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Feature:
    """A model head (Optimum called it a `feature`): the transformers Auto class that loads it, and the endings of
    its model class names (BertForSequenceClassification), by which `check_model_matches` recognises it."""

    name: str
    auto_class: str
    head_suffix: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """One task: what it reads, loads, trains, scores and shows. Each field says what varies; the rest of ortlab
    reads these instead of branching on `spec.task`."""

    name: str
    description: str  # one line, for the forms and the CLI's help
    feature: Feature  # the model head it loads and checks (`ortlab.tasks.heads`)
    peft_task_type: str  # peft's task type: which PeftModel wraps the model (and which head modules stay trained)
    pipeline_tag: str  # the Hub's pipeline tag, for the model card
    short: str  # in a run's default name
    # transformers' table of model types with this head (transformers.models.auto.modeling_auto); None: the head is
    # any encoder-decoder (config.is_encoder_decoder), as the class names vary too much
    head_table: str | None
    # --- the data ---
    columns: tuple[str, ...]  # the DataSpec column fields it reads (a field of another task's is refused)
    labels: str | None = None  # "row": a label per row, "word": a tag per word, None: no label column
    words: bool = False  # the text column holds word lists (token classification)
    blocks: bool = False  # plain text is joined and cut into blocks of max_length (no padding, no label)
    chat: bool = False  # takes conversations or instruction pairs (messages / prompt+response columns), templated
    target: bool = False  # maps a source text to a target text (seq2seq)
    pairs: bool = False  # preference data: pairs or good/bad answers (`ortlab.data.pairs`), checked row by row
    # --- the model ---
    lm_head: bool = False  # its head predicts the vocabulary (logits batch x length x vocab: memory, FLOPs, chat)
    # --- behaviour, by path ("module:name"), resolved by the caller's layer ---
    tokenize: str = "ortlab.data.inputs:tokenize"  # both splits to model inputs, `(prepared, tokenizer, task, ...)`
    rows: str = ""  # the row tokenizer factory, `(prepared, tokenizer, max_length, max_target_length) -> fn`
    collate: str = ""  # the batch collator factory, `(tokenizer, model, prepared, pad_to_multiple_of) -> collator`
    metrics: str | None = None  # the compute_metrics factory, `(label_names, tokenizer, generated) -> fn`
    # its held-out rows as a causal LM's plain rows, for what takes example inputs from the run's data (the exports'
    # parity checks): `(prepared, tokenizer, max_length, n) -> [{input_ids, prompt}]`, `prompt` the rendered prompt
    # text to continue; "": the rows its own `tokenize` (and, for chats, the chat template) gives
    lm_rows: str = ""
    trainer: str = "ortlab.train.trainer:ORTTrainer"
    arguments: str = "ortlab.train.args:ORTTrainingArguments"
    # --- scores and generations ---
    argmax: bool = True  # evaluation keeps predicted ids only (not the logits)
    perplexity: bool = False  # exp(eval loss) is reported
    generates: bool = False  # scored by generating the target (generation.predict_with_generate, num_beams, ...)
    answers_prompts: bool = False  # shows a few generations at each evaluation (generation.prompts, ...)
    headline: tuple[str, ...] = ()  # the eval scores a log line shows first
    # --- faces and exports ---
    exports: tuple[str, ...] = ("onnx",)  # what `ortlab export` can write for its model
    form: tuple[str, ...] = ()  # the spec fields (dotted) the workbench and the sidebar show for it

    def part(self, field: str) -> Any:
        """The function or class a behaviour field names, imported now (by the caller, which is above the data and
        training layers)."""
        return resolve(getattr(self, field))

    def to_dict(self) -> dict[str, Any]:
        """As the server sends it to the sidebar (JSON): what a form needs."""
        return {"name": self.name, "description": self.description, "form": list(self.form)}


def resolve(path: str) -> Any:
    """`"package.module:name"` -> the object."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
