"""Reading a loaded dataset's columns in Arrow, a bounded chunk at a time, and holding out eval rows, without
copies as large as the data (the checks of `ortlab.data.checks` run on 4M-row files in flat memory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


def arrow_column(ds: Dataset, column: str) -> Any:
    """`column` as one Arrow array, in the dataset's row order (a split's or shuffle's indices taken in Arrow).

    Why not `ds[column]`: in datasets 4+ that is a lazy column whose iteration fetches one row at a time, which
    spent about a minute of `ortlab train`'s start on a 400,000-row CSV before any model loaded; datasets' own
    Arrow-formatted read through indices took 3 s for one column of 360,000 rows, Arrow's `take` 0.1 s.
    A whole column is a copy as large as the column: the checks read `column_chunks` instead."""
    values = ds.data.column(column)
    indices = getattr(ds, "_indices", None)
    return values if indices is None else values.take(indices.column(0))


CHECK_CHUNK = 65_536  # rows of one column the checks hold at a time (a few MB of short texts)


def column_chunks(ds: Dataset, column: str, rows: int | None = None) -> Iterator[tuple[int, Any]]:
    """(first row, Arrow array) for `rows` rows of `column` at a time, in the dataset's row order.

    Why: the whole-column checks of a 4M-row CSV made copies of its 3.6M-row text column (the trimmed text for
    the empty count, a split's `take`), a good part of the lazy path's peak of 1.6 GB (0.8 at 20k rows); slices of the
    memory-mapped table are not copies, and a split's indices are taken a chunk at a time."""
    rows = rows or CHECK_CHUNK
    values = ds.data.column(column)
    indices = getattr(ds, "_indices", None)
    positions = None if indices is None else indices.column(0)
    total = len(values) if positions is None else len(positions)
    for start in range(0, total, rows):
        if positions is None:
            yield start, values.slice(start, rows)
        else:
            yield start, gather(values, positions.slice(start, rows))


def gather(values: Any, positions: Any) -> Any:
    """`values.take(positions)` for a chunked column, one stored chunk at a time.

    Why: Arrow's take on a chunked array first joins all its chunks into one array, a copy of the whole column
    for every call (a 4M-row CSV's label column is 4,000 chunks: 48 MB per call, kept by the allocator after)."""
    import numpy as np
    import pyarrow as pa

    if values.num_chunks <= 1:
        return values.take(positions)
    wanted = np.asarray(positions.to_numpy() if hasattr(positions, "to_numpy") else positions, dtype=np.int64)
    order = np.argsort(wanted, kind="stable")
    ordered = wanted[order]
    starts = np.cumsum([0] + [len(c) for c in values.chunks])
    bounds = np.searchsorted(ordered, starts)  # ordered[bounds[i]:bounds[i + 1]] fall in chunk i
    pieces = []
    for i in np.flatnonzero(np.diff(bounds)):
        pieces.append(values.chunk(int(i)).take(pa.array(ordered[bounds[i] : bounds[i + 1]] - starts[i])))
    joined = pa.concat_arrays(pieces) if pieces else pa.array([], type=values.type)
    return pa.chunked_array([joined.take(pa.array(np.argsort(order, kind="stable")))])


def values_of(ds: Dataset, column: str) -> list:
    """Every value of `column` as Python objects (`arrow_column`, then one conversion)."""
    return arrow_column(ds, column).to_pylist()


def distinct_values(ds: Dataset, column: str) -> list:
    """The distinct values of `column` (of a list column: of its items, as one list), read a chunk at a time.
    Types Arrow cannot take distinct values of come back as every value (a rare case: lists of lists)."""
    found = _distinct(chunk for _, chunk in column_chunks(ds, column))
    return values_of(ds, column) if found is None else found


def distinct_values_outside(ds: Dataset, held: Dataset, column: str) -> list | None:
    """`distinct_values` of the rows of `ds` that are not in `held` (some of `ds`'s own rows, as `hold_out` leaves
    them), read from `ds` in its stored order a slice at a time with the held rows masked out. None when `ds` is
    itself a selection, or of a type Arrow cannot take distinct values of (the caller reads the rest with
    `distinct_values`).

    Why not `distinct_values` of the rest: the rest is a random permutation of the table, gathered a chunk at a
    time (0.9 s of a 4M-row CSV's start, half its checks); here the reads are contiguous and the mask is a byte a
    row."""
    import numpy as np
    import pyarrow as pa

    held_indices = getattr(held, "_indices", None)
    if getattr(ds, "_indices", None) is not None or held_indices is None:
        return None
    keep = np.ones(len(ds), dtype=bool)
    keep[held_indices.column(0).to_numpy()] = False
    return _distinct(
        chunk.filter(pa.array(keep[start : start + len(chunk)])) for start, chunk in column_chunks(ds, column)
    )


def _distinct(chunks: Iterator[Any]) -> list | None:
    """The distinct values over Arrow `chunks` (of list chunks: of their items, as one list), or None for a type
    Arrow cannot take distinct values of."""
    import pyarrow as pa

    seen: dict = {}
    is_list = False
    for chunk in chunks:
        is_list = pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type)
        try:
            flat = chunk.combine_chunks().flatten() if is_list else chunk
            seen.update(dict.fromkeys(flat.unique().to_pylist()))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return None
    values = list(seen)
    return [values] if is_list else values  # one "row" holding every tag: the label checks see the same tags


def hold_out(ds: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """(train, eval): the rows `ds.train_test_split(test_size=fraction, seed=seed)` gives, in its order.

    Why not that call itself: it hands its permutation to `select`, which turns it into a Python list (at 4M rows,
    a 230 MB spike of int objects, left behind as a fragmented heap that the rest of the run carried). The same
    permutation (numpy's default generator from the seed) goes here straight into an Arrow indices table."""
    import math

    n = len(ds)
    n_test = math.ceil(fraction * n)
    if getattr(ds, "_indices", None) is not None or not 0 < n_test < n:  # (datasets says what is wrong)
        split = ds.train_test_split(test_size=fraction, seed=seed)
        return split["train"], split["test"]
    import datasets
    import numpy as np
    import pyarrow as pa
    from datasets.fingerprint import Hasher
    from datasets.table import InMemoryTable

    permutation = np.random.default_rng(seed).permutation(n)

    def part(indices: Any, name: str) -> Dataset:
        table = InMemoryTable(pa.table({"indices": pa.array(indices, type=pa.uint64())}))
        # A fingerprint from the source's, the seed and the share (what a cache of a later map is keyed on): left
        # to datasets, it would hash (pickle) the whole indices table, another 150 MB at 4M rows.
        fingerprint = Hasher.hash(("ortlab.hold_out", ds._fingerprint, name, seed, fraction))
        return datasets.Dataset(
            ds.data, info=ds.info.copy(), split=ds.split, indices_table=table, fingerprint=fingerprint
        )

    return part(permutation[n_test:], "train"), part(permutation[:n_test], "eval")
