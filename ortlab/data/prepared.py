"""What the loading and checking hand on to the tokenizing: the checked splits and the columns chosen
(`Prepared`), and the one error for data that cannot be used (`DataError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ortlab.chat import check_messages, from_pair
from ortlab.errors import OrtlabError

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


ROW_COLUMN = "__ortlab_row__"
"""Lazy data (`Prepared.lazy`): each row's position in its source split (data rows from 0, the header is not a row),
so a row that fails when training reaches it is named by where it is in the file, after any shuffle or split."""


class DataError(OrtlabError, ValueError):
    """The data cannot be used for this run; the message says what is wrong and how to fix it."""


@dataclass
class Prepared:
    """Raw, checked data for one run: the splits and what was decided about their columns and labels."""

    train: Dataset
    eval: Dataset
    text_column: str | None
    text_pair_column: str | None
    label_column: str | None
    label_names: list[str] = field(default_factory=list)
    source_files: list[str] = field(default_factory=list)
    target_column: str | None = None  # seq2seq: the text to produce (text_column is its source)
    messages_column: str | None = None  # causal-lm chat data: conversations
    prompt_column: str | None = None  # causal-lm instruction data: prompt ...
    response_column: str | None = None  # ... and the answer to learn
    packing: bool = False
    max_length: int | None = None  # hyper.max_length as the model allows it (set by ortlab.fit.check_fit)
    lazy: bool = False  # rows tokenized as training reads them (ortlab.data.inputs.tokenize); they carry ROW_COLUMN
    # causal-lm data prepared lazily (ortlab.data.lazylm.plan): the seeded order, and the cut-off examples counted
    seed: int = 42
    shuffle: bool = True
    dropped: Any = None  # lazylm.Dropped: chat examples read and dropped (every assistant token cut off)

    pairs: Any = None  # task preference: the shape found and its columns (`ortlab.data.pairs.PairsMapping`)
    head: Dataset | None = None  # streamed data: the first training rows, read for the checks (train is a stream)

    @property
    def streamed(self) -> bool:
        """The training split is a stream (datasets' IterableDataset): no length, read once in order."""
        return self.head is not None

    def first_rows(self, n: int) -> Dataset:
        """The first `n` training rows as a Dataset (from the head read for the checks when streamed)."""
        ds = self.head if self.head is not None else self.train
        return ds.select(range(min(n, len(ds))))

    def train_size(self) -> str:
        """The training rows for a log line: a count, or what is known of a stream."""
        return "a stream of" if self.streamed else f"{len(self.train)}"

    @property
    def chat(self) -> bool:
        return self.messages_column is not None or self.prompt_column is not None

    def conversations(self, split: str = "eval", limit: int | None = None) -> list[list[dict[str, str]]]:
        """The rows of a chat split as conversations ({role, content} turns)."""

        ds = self.eval if split == "eval" else (self.head if self.head is not None else self.train)
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        if self.messages_column:
            return [check_messages(m, f"{split} row {i}") for i, m in enumerate(ds[self.messages_column])]
        prompts, responses = ds[self.prompt_column], ds[self.response_column]
        return [from_pair(p, r, f"{split} row {i}") for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]

    @property
    def num_labels(self) -> int:
        return len(self.label_names)
