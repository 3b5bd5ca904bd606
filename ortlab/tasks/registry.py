"""The tasks ortlab trains, one module each; a new task is one module here plus its tests and docs."""

from __future__ import annotations

from ortlab.tasks import alignment, causal_lm, seq2seq_lm, sequence_classification, token_classification
from ortlab.tasks.task import Task

TASKS: dict[str, Task] = {
    m.TASK.name: m.TASK for m in (sequence_classification, token_classification, causal_lm, seq2seq_lm, alignment)
}
NAMES: tuple[str, ...] = tuple(TASKS)


def get_task(name: str) -> Task:
    """The task called `name`, or a ValueError naming the tasks there are."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}") from None
