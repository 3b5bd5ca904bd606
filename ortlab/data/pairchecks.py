"""Checking every row of preference or instruction data before any model loads, a chunk of rows at a time.

A bad row (chosen equal to rejected, an empty side, a value missing or not text, a KTO label that is not a yes/no,
two conversations that do not share a prompt, chosen and rejected in different forms) fails the check with its
index and column; the check reads on to the end, so the error says how many rows are bad in all, and shows the
first few. After tokenizing, `check_prompt_lengths` does the same for prompts that fill `max_length` (no answer
token would be left to learn from: TRL drops such rows without a word, ortlab names them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ortlab.chat import ChatDataError
from ortlab.data.columnar import column_chunks
from ortlab.data.pairs import PairsMapping, RowError, normalize_row

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

CHUNK = 4096  # rows read into Python at a time
SHOWN = 5  # bad rows the error shows


class PairDataError(ChatDataError):
    """Rows that cannot be used. `rows`: the first few (index, reason); `count`: how many in all."""

    def __init__(self, message: str, rows: list[tuple[int, str]], count: int):
        super().__init__(message)
        self.rows = rows
        self.count = count


class _Tally:
    """The bad rows seen: the first `shown` with their reasons, and how many."""

    def __init__(self, shown: int):
        self.shown, self.rows, self.count = shown, [], 0

    def add(self, index: int, reason: str) -> None:
        self.count += 1
        if len(self.rows) < self.shown:
            self.rows.append((index, reason))

    def raise_if_any(self, where: str, total: int, what: str) -> None:
        if not self.count:
            return
        lines = [f"  row {i}: {reason}" for i, reason in self.rows]
        more = f" (the first {len(self.rows)} below)" if self.count > len(self.rows) else ""
        raise PairDataError(
            f"{where}: {self.count} of {total} rows {what}{more}:\n" + "\n".join(lines), self.rows, self.count
        )


def row_chunks(dataset: Dataset, columns: list[str], chunk: int = CHUNK) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(index of the first row, the rows as dicts of `columns`) for `chunk` rows at a time, in the dataset's order.
    Read in Arrow (`ortlab.data.columnar.column_chunks`), only the columns named: twice as fast as datasets'
    slices of every column, and a chunk's worth of Python objects at a time."""
    readers = [column_chunks(dataset, c, chunk) for c in columns]
    for parts in zip(*readers, strict=True):
        start = parts[0][0]
        values = [part.to_pylist() for _, part in parts]
        yield start, [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]


def check_rows(
    dataset: Dataset, mapping: PairsMapping, where: str = "data", shown: int = SHOWN, chunk: int = CHUNK
) -> int:
    """Every row readable in `mapping`'s shape (`ortlab.data.pairs.normalize_row`), or a PairDataError naming the
    first `shown` bad rows (index and column) and how many in all. Returns the number of rows checked."""
    if mapping.shape is None:
        raise PairDataError(f"{where}: {mapping.found}", [], 0)
    missing = [c for c in mapping.columns.values() if c not in dataset.column_names]
    if missing:
        raise PairDataError(
            f"{where}: the dataset has no column {', '.join(map(repr, missing))} (its columns: "
            f"{', '.join(dataset.column_names)})",
            [],
            0,
        )
    tally = _Tally(shown)
    for start, rows in row_chunks(dataset, list(dict.fromkeys(mapping.columns.values())), chunk):
        for i, row in enumerate(rows):
            try:
                normalize_row(row, mapping)
            except RowError as e:
                tally.add(start + i, str(e))
    tally.raise_if_any(where, len(dataset), f"cannot be used as {mapping.shape} data")
    return len(dataset)


def check_prompt_lengths(
    tokenized: Dataset, max_length: int, where: str = "data", shown: int = SHOWN, chunk: int = CHUNK
) -> None:
    """Every tokenized row's prompt shorter than `max_length` (its `prompt_length` column, from
    `ortlab.data.pairtokens`), or a PairDataError naming the first `shown` rows whose prompt leaves no room for
    the answer, and how many in all."""
    tally = _Tally(shown)
    for start, lengths in column_chunks(tokenized, "prompt_length", chunk):
        for i, n in enumerate(lengths.to_pylist()):
            if n >= max_length:
                tally.add(start + i, f"the prompt is {n} tokens, so no answer token fits in max_length {max_length}")
    tally.raise_if_any(
        where,
        len(tokenized),
        f"have a prompt that fills max_length ({max_length} tokens): raise hyper.max_length or shorten the prompts",
    )
