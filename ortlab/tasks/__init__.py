"""Tasks: what a run trains, one module per task (`sequence_classification`, `token_classification`, `causal_lm`,
`seq2seq_lm`, and `alignment` for task preference), each a `Task` record (`ortlab.tasks.task`) that the spec, the
data checks, the trainer's assembly, the scores, the exports and the forms ask instead of comparing the task's name
with a string; and the model heads and how a model for a task is found and loaded (`ortlab.tasks.heads`).

Standard library only at import (transformers inside the functions that load): it sits below the spec."""

from __future__ import annotations

from ortlab.tasks.heads import (
    FEATURES,
    HEAD_TABLES,
    TASK_FEATURES,
    ModelError,
    check_model_fits_task,
    check_model_matches,
    get_feature,
    load_model,
    load_tokenizer,
    resolve_model,
)
from ortlab.tasks.registry import NAMES, TASKS, get_task
from ortlab.tasks.task import Feature, Task, resolve

__all__ = [
    "FEATURES",
    "HEAD_TABLES",
    "NAMES",
    "TASKS",
    "TASK_FEATURES",
    "Feature",
    "ModelError",
    "Task",
    "check_model_fits_task",
    "check_model_matches",
    "get_feature",
    "get_task",
    "load_model",
    "load_tokenizer",
    "resolve",
    "resolve_model",
]
