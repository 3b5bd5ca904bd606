"""Checking loaded data against the task, then splitting and capping it: `load_and_check`, everything that can
be checked without a model (cheap: reading the files), so a bad column or an empty file fails before a model
is loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortlab.chat import ChatDataError
from ortlab.data.chatcolumns import check_messages_column, check_pairs_columns
from ortlab.data.columnar import column_chunks, distinct_values, distinct_values_outside, hold_out
from ortlab.data.columns import (
    SOURCE_NAMES,
    TARGET_NAMES,
    chat_columns,
    is_string,
    is_string_list,
    misshapen_messages,
    propose_mapping,
    seq2seq_columns,
)
from ortlab.data.load import load_raw, read_error
from ortlab.data.prepared import ROW_COLUMN, DataError, Prepared
from ortlab.safeio import ascii_int
from ortlab.tasks import get_task

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

    from ortlab.spec import DataSpec


def check_chat(raw: dict[str, Dataset], spec: DataSpec) -> dict[str, str | None] | None:
    """The chat columns of a causal-lm run ({messages_column} or {prompt_column, response_column}), or None for
    raw text; every row of both splits checked (cheap: no tokenizer), naming the first bad row."""

    if spec.text_column is not None:
        return None
    train = raw[spec.train_split]
    columns = list(train.features)
    given = {k: getattr(spec, k) for k in ("messages_column", "prompt_column", "response_column")}
    chat = given if any(given.values()) else chat_columns(train) or misshapen_messages(train)
    if chat is None:
        return None
    for role, col in chat.items():
        if col is not None and col not in columns:
            raise DataError(f"data.{role}: no column {col!r}; the data has columns {columns}")
    splits = [(spec.train_split, train)] + ([(spec.eval_split, raw[spec.eval_split])] if spec.eval_split else [])
    try:
        for split, ds in splits:
            if chat["messages_column"]:
                check_messages_column(ds, chat["messages_column"], f"data.messages_column: {split!r}")
            else:
                where = f"data.prompt_column/response_column: {split!r}"
                check_pairs_columns(ds, chat["prompt_column"], chat["response_column"], where)
    except ChatDataError as e:
        raise DataError(str(e)) from None
    return chat


def check_columns(raw: dict[str, Dataset], spec: DataSpec, task: str) -> tuple[str, str | None, str | None]:
    """The loaded data's (text, pair, label) columns to use, or a DataError naming the problem."""
    if spec.train_split not in raw:
        raise DataError(f"data.train_split: no split {spec.train_split!r}; the data has {sorted(raw)}")
    train = raw[spec.train_split]
    if len(train) == 0:
        raise DataError(f"data.source: the {spec.train_split!r} split of {spec.source!r} is empty")
    features = train.features
    columns = list(features)
    guess = propose_mapping(train)
    record = get_task(task)
    text = spec.text_column or guess["text_column"]
    label = None if not record.labels else (spec.label_column or guess["label_column"])
    pair = spec.text_pair_column
    for role, col in (("text_column", text), ("text_pair_column", pair), ("label_column", label)):
        if col is not None and col not in columns:
            raise DataError(f"data.{role}: no column {col!r}; the data has columns {columns}")
    if text is None:
        raise DataError(f"data.text_column: found no text column among {columns}; set data.text_column")
    if record.words:
        if not is_string_list(features[text]):
            raise DataError(
                f"data.text_column: token classification needs a column of word lists, but {text!r} holds "
                f"{features[text]}; use task sequence-classification for whole texts"
            )
    elif not is_string(features[text]):
        raise DataError(
            f"data.text_column: column {text!r} is not text (it holds {features[text]}); name a text column"
        )
    if pair is not None and not is_string(features[pair]):
        raise DataError(f"data.text_pair_column: column {pair!r} is not text (it holds {features[pair]})")
    if record.labels and label is None:
        raise DataError(f"data.label_column: found no label column among {columns}; set data.label_column")
    if spec.eval_split is not None and spec.eval_split not in raw:
        raise DataError(f"data.eval_split: no split {spec.eval_split!r}; the data has {sorted(raw)}")
    return text, pair, label


def check_seq2seq(raw: dict[str, Dataset], spec: DataSpec) -> tuple[str, str]:
    """The (source, target) text columns of a seq2seq run, or a DataError naming the columns found and the fix."""
    if spec.train_split not in raw:
        raise DataError(f"data.train_split: no split {spec.train_split!r}; the data has {sorted(raw)}")
    train = raw[spec.train_split]
    if len(train) == 0:
        raise DataError(f"data.source: the {spec.train_split!r} split of {spec.source!r} is empty")
    if spec.eval_split is not None and spec.eval_split not in raw:
        raise DataError(f"data.eval_split: no split {spec.eval_split!r}; the data has {sorted(raw)}")
    features = train.features
    columns = list(features)
    guess_source, guess_target = seq2seq_columns(train)
    source = spec.source_column or guess_source
    target = spec.target_column or guess_target
    for role, col in (("source_column", source), ("target_column", target)):
        if col is not None and col not in columns:
            raise DataError(f"data.{role}: no column {col!r}; the data has columns {columns}")
    for role, col, names in (("source_column", source, SOURCE_NAMES), ("target_column", target, TARGET_NAMES)):
        if col is None:
            raise DataError(
                f"data.{role}: found no {role.split('_')[0]} column among {columns} (looked for "
                f"{', '.join(names[:6])}, ...); set data.{role} (CLI: --{role.replace('_', '-')})"
            )
        if not is_string(features[col]):
            raise DataError(f"data.{role}: column {col!r} is not text (it holds {features[col]}); name a text column")
    if source == target:
        raise DataError(f"data.target_column: {target!r} is also the source column; name two different columns")
    splits = [(spec.train_split, train)]
    if spec.eval_split is not None:
        splits.append((spec.eval_split, raw[spec.eval_split]))
    for split, ds in splits:
        for role, col in (("source_column", source), ("target_column", target)):
            if col not in ds.column_names:
                raise DataError(f"data.{role}: the {split!r} split has no column {col!r} (it has {ds.column_names})")
            missing = [
                start + i
                for start, chunk in column_chunks(ds, col)
                if chunk.null_count
                for i in range(len(chunk))
                if not chunk[i].is_valid
            ]
            if missing:
                raise DataError(
                    f"data.{role}: {len(missing)} row(s) of the {split!r} split have no {col!r} (first: row "
                    f"{missing[0]}); fill or drop them"
                )
    return source, target


def label_names(train: Dataset, label: str, task: str, values: list | None = None) -> list[str]:
    """Sorted label names; checks the labels fit the task (several classes, no regression targets). `values`: the
    distinct labels of `train` when the caller has them (read `distinct_values` otherwise)."""
    feature = train.features[label]
    names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    if names:
        return list(names)
    # The distinct values decide everything below: 400,000 rows of two labels are two values.
    values = distinct_values(train, label) if values is None else values
    if get_task(task).labels == "word":
        if not all(isinstance(v, list) for v in values):
            raise DataError(f"data.label_column: token classification needs a list of tags per row in {label!r}")
        flat = {str(t) for row in values for t in row}
    else:
        if any(isinstance(v, float) and not float(v).is_integer() for v in values):
            raise DataError(
                f"data.label_column: {label!r} holds fractional numbers (a regression target); "
                "ortlab trains classifiers: use class labels"
            )
        if any(isinstance(v, list) for v in values):
            raise DataError(f"data.label_column: {label!r} holds lists; for tags per word use token-classification")
        flat = {str(v) for v in values if v is not None}
    if len(flat) < 2:
        raise DataError(
            f"data.label_column: {label!r} has {len(flat)} distinct label(s); a classifier needs at least 2"
        )
    if len(flat) > 1000:
        raise DataError(f"data.label_column: {label!r} has {len(flat)} distinct labels; is it really a label column?")

    # Whole numbers first, in numeric order (ASCII digits only: '²' is a name like any other, not a number).
    def key(name: str) -> tuple[bool, int, str]:
        number = ascii_int(name, signed=True)
        return number is None, number or 0, name

    return sorted(flat, key=key)


HEAD_ROWS = 1000  # streamed data: training rows read for the checks before any model loads
EVAL_ROWS = 1000  # streamed data: eval rows when data.max_eval_samples does not say
SHUFFLE_BUFFER = 10_000  # streamed data: rows a seeded shuffle draws from (datasets' buffer shuffle)


def load_and_check(spec: DataSpec, task: str, seed: int) -> Prepared:
    """Load the data, check it against the task, split and cap it. No model, no tokenizer needed."""
    raw, files = load_raw(spec)
    record = get_task(task)
    if record.pairs:
        from ortlab.data.pairdata import check_pairs

        return check_pairs(raw, files, spec, seed)
    if any(not hasattr(ds, "__len__") for ds in raw.values()):
        return _check_stream(raw, files, spec, task, seed)
    target = None
    chat = None
    if record.chat:
        if spec.train_split not in raw:
            raise DataError(f"data.train_split: no split {spec.train_split!r}; the data has {sorted(raw)}")
        if spec.eval_split is not None and spec.eval_split not in raw:
            raise DataError(f"data.eval_split: no split {spec.eval_split!r}; the data has {sorted(raw)}")
        chat = check_chat(raw, spec)
    if spec.packing and chat is None:
        raise DataError(
            "data.packing: packing joins short chat examples into full rows, and this is raw text, which is already "
            "cut into full blocks of hyper.max_length; remove data.packing (or name the chat columns)"
        )
    if chat is not None:
        text, pair, label = None, None, None
    elif record.target:
        (text, target), pair, label = check_seq2seq(raw, spec), None, None
    else:
        text, pair, label = check_columns(raw, spec, task)
    lazy = spec.lazy and chat is None and not record.blocks  # causal-lm: ortlab.data.lazylm.plan decides
    distinct = None  # the training split's distinct labels, when read on the way (label_names reads them if not)
    if spec.lazy:  # before any split or shuffle: the position a late failure names is the row's place in its source
        import numpy as np

        used = {spec.train_split, spec.eval_split}
        raw = {name: ds.add_column(ROW_COLUMN, np.arange(len(ds))) if name in used else ds for name, ds in raw.items()}
    train = raw[spec.train_split]
    splits = [(spec.train_split, train)] + ([(spec.eval_split, raw[spec.eval_split])] if spec.eval_split else [])
    if chat is None:
        read = {"source": text, "target": target} if record.target else {"text": text, "text_pair": pair}
        for split, ds in splits:
            _check_values(ds, split, task, **read, label=label)
    if spec.eval_split is not None:
        evaluation = raw[spec.eval_split]
        if len(evaluation) == 0:
            raise DataError(
                f"data.eval_split: the {spec.eval_split!r} split has no rows, so there is nothing to evaluate on; "
                "name a split with rows, or unset data.eval_split to hold out part of the training split"
            )
    else:
        if len(train) < 2:
            raise DataError("data.source: need at least 2 rows to hold some out for evaluation")
        source = train
        train, evaluation = hold_out(train, spec.eval_fraction, seed)
        if label and not spec.max_train_samples:  # the labels trained on: the source's less the held-out rows'
            distinct = distinct_values_outside(source, evaluation, label)
    if spec.max_train_samples:
        train = train.shuffle(seed=seed).select(range(min(spec.max_train_samples, len(train))))
    if spec.max_eval_samples:
        evaluation = evaluation.select(range(min(spec.max_eval_samples, len(evaluation))))
    names = label_names(train, label, task, distinct) if label else []
    if label:
        _check_labels_known(evaluation, label, task, names, "eval split")
    return Prepared(
        train, evaluation, text, pair, label, names, files, target, **(chat or {}), packing=spec.packing, lazy=lazy
    )


def _check_stream(raw: dict, files: list[str], spec: DataSpec, task: str, seed: int) -> Prepared:
    """Streamed data (datasets' IterableDataset): the same checks on a head sample, the eval split a bounded
    sample read first, the training split a seeded buffer shuffle of the rest, read as training asks.

    Rows carry their position in the source split (ROW_COLUMN), so a row that fails later (a label the head did not
    show, a value that cannot be tokenized) fails the run naming where it is."""
    import datasets

    if spec.train_split not in raw:
        raise DataError(f"data.train_split: no split {spec.train_split!r}; the data has {sorted(raw)}")
    if spec.eval_split is not None and spec.eval_split not in raw:
        raise DataError(f"data.eval_split: no split {spec.eval_split!r}; the data has {sorted(raw)}")

    def numbered(stream: Any) -> Any:
        return stream.map(lambda _, idx: {ROW_COLUMN: idx}, with_indices=True, batched=True)

    def materialise(rows: list[dict], features: Any) -> Dataset:
        try:
            return datasets.Dataset.from_list(rows, features=features)
        except Exception:
            return datasets.Dataset.from_list(rows)

    stream = numbered(raw[spec.train_split])
    n_eval = spec.max_eval_samples or EVAL_ROWS
    features = raw[spec.train_split].features
    if features is not None:
        features = datasets.Features({**features, ROW_COLUMN: datasets.Value("int64")})

    def read(rows: Any, n: int) -> list[dict]:
        try:
            return list(rows.take(n))
        except Exception as e:  # a CSV that does not parse, found in the rows read first: said before any model
            raise read_error(e, spec.source) or e from None

    if spec.eval_split is not None:
        evaluation = materialise(read(numbered(raw[spec.eval_split]), n_eval), features)
        head = materialise(read(stream, HEAD_ROWS), features)
        train = stream
    else:  # the first n_eval rows are held out: read once, never trained on
        first = read(stream, n_eval + HEAD_ROWS)
        evaluation, head = materialise(first[:n_eval], features), materialise(first[n_eval:], features)
        train = stream.skip(n_eval)
    if len(head) == 0:
        raise DataError(
            f"data.source: the {spec.train_split!r} split of {spec.source!r} has no training rows after the "
            f"{n_eval} held out for evaluation; set data.streaming: false for a small dataset"
        )
    checked = {spec.train_split: head, **({spec.eval_split: evaluation} if spec.eval_split else {})}
    record = get_task(task)
    target, chat = None, check_chat(checked, spec) if record.chat else None
    if spec.packing and chat is None:
        raise DataError("data.packing: packing is for chat data; raw text is already cut into full blocks")
    if chat is not None:  # the head's and the eval rows' conversations checked; later rows as training reads them
        text, pair, label, read = None, None, None, {}
    elif record.target:
        (text, target), pair, label = check_seq2seq(checked, spec), None, None
        read = {"source": text, "target": target}
    else:
        text, pair, label = check_columns(checked, spec, task)
        read = {"text": text, "text_pair": pair}
    for split, ds in (("train (first rows)", head), ("eval", evaluation)):
        _check_values(ds, split, task, **read, label=label)
    names = label_names(head, label, task) if label else []
    if label:
        _check_labels_known(evaluation, label, task, names, "eval split")
    if spec.shuffle:
        train = train.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    if spec.max_train_samples:
        train = train.take(spec.max_train_samples)
    return Prepared(
        train,
        evaluation,
        text,
        pair,
        label,
        names,
        files,
        target,
        **(chat or {}),
        packing=spec.packing,
        lazy=True,
        head=head,
        seed=seed,
        shuffle=spec.shuffle,
    )


def _check_values(ds: Dataset, split: str, task: str, **columns: str | None) -> None:
    """Every row has a value in each column the run reads, and the text is not mostly empty.

    A missing value (an empty CSV cell, a JSON null) would stop the run inside the tokenizer or the label mapping
    after the model has loaded; a text column that is mostly empty strings trains a classifier on nothing but
    [CLS] [SEP], silently. Row numbers count the split's data rows from 0 (the header is not a row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for role, col in columns.items():
        if col is None or col not in ds.column_names:
            continue
        # Counted in Arrow (nulls, trimmed lengths), not over Python objects: 4M rows in a fraction of a second;
        # a chunk at a time (`column_chunks`), so memory stays flat however long the column is.
        total = nulls = empty = 0
        first = None
        count_empty = not (role == "label" or (role == "text" and get_task(task).blocks))
        for start, values in column_chunks(ds, col):
            total += len(values)
            if values.null_count:
                if first is None:
                    first = start + pc.index(pc.is_null(values), True).as_py()
                nulls += values.null_count
            elif count_empty and not nulls:
                empty += _empty_count(values, pa, pc)
        if nulls:
            raise DataError(
                f"data.{role}_column: {nulls} of {total} row(s) of the {split!r} split have no {col!r} "
                f"(first: row {first}); fill or drop those rows"
            )
        if count_empty and total and empty * 2 > total:
            raise DataError(
                f"data.{role}_column: {empty} of {total} rows of the {split!r} split have an empty {col!r}, "
                f"so the model would learn from nothing; is {col!r} the right column? (set data.{role}_column)"
            )


def _empty_count(values: Any, pa: Any, pc: Any) -> int:
    """Rows of an Arrow chunk (with no nulls) that hold blank text or an empty list. Raw text for a causal LM has
    blank lines between paragraphs: those are not counted (the caller skips that column)."""
    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.sum(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)).as_py() or 0
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pc.sum(pc.equal(pc.list_value_length(values), 0)).as_py() or 0
    return sum(1 for v in values.to_pylist() if (not v.strip() if isinstance(v, str) else not v))


def _check_labels_known(ds: Dataset, label: str, task: str, names: list[str], where: str) -> None:
    """Every label in `ds` must be one of the classes the model is built with (from the training split).

    A label seen only in evaluation would crash after the model has loaded (or, as an integer, be passed on
    unmapped and compared against the wrong class): say so now, naming the labels.
    """
    feature = ds.features[label]
    class_names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    values = distinct_values(ds, label)  # a chunk at a time: an eval split may be large too
    flat = [t for row in values for t in row] if get_task(task).labels == "word" else values
    if class_names:  # ClassLabel: integer ids into the names
        unknown = sorted({v for v in flat if v is not None and not (0 <= int(v) < len(names)) and v != -100})
    else:
        known = set(names)
        unknown = sorted({str(v) for v in flat if v is not None and str(v) not in known})
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise DataError(
            f"data.label_column: the {where} has labels the training split does not have: {shown} "
            f"(training labels: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}). Add training rows "
            "with these labels, drop those rows, or let ortlab hold out the eval rows (unset data.eval_split)"
        )
