"""Datasets: find the source, load it, check it fits the task, split, map labels, tokenize, collate.

Everything that can be checked without a model happens in `load_and_check` (cheap: reading the files), so a
bad column or an empty file fails before a model is loaded. Tokenized datasets are cached by `datasets` (keyed
on the data, the tokenizer and the settings), so a second run over the same data starts at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.assets import EMBEDDED_PREFIX, embedded_dataset
from ortlab.errors import OrtlabError

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

    from ortlab.spec import DataSpec

SUFFIX_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
}
TEXT_NAMES = ("text", "sentence", "review", "content", "document", "question", "sentence1", "tokens", "words")
LABEL_NAMES = ("label", "labels", "category", "class", "sentiment", "ner_tags", "tags", "target")
PAIR_NAMES = ("text_pair", "sentence2", "hypothesis", "context")
# seq2seq: the names summarization, translation and question-answering data sets give their input and output
SOURCE_NAMES = ("source", "src", "input", "inputs", "document", "article", "text", "question", "prompt", "sentence")
TARGET_NAMES = ("target", "tgt", "output", "outputs", "summary", "highlights", "translation", "answer", "response")
# chat / instruction data for a causal LM (TRL's names first: messages; prompt + completion)
MESSAGES_NAMES = ("messages", "conversations", "conversation", "chat", "dialog", "dialogue")
PROMPT_NAMES = ("prompt", "instruction")
RESPONSE_NAMES = ("completion", "response")


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

    @property
    def chat(self) -> bool:
        return self.messages_column is not None or self.prompt_column is not None

    def conversations(self, split: str = "eval", limit: int | None = None) -> list[list[dict[str, str]]]:
        """The rows of a chat split as conversations ({role, content} turns)."""
        from ortlab.chat import check_messages, from_pair

        ds = self.eval if split == "eval" else self.train
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        if self.messages_column:
            return [check_messages(m, f"{split} row {i}") for i, m in enumerate(ds[self.messages_column])]
        prompts, responses = ds[self.prompt_column], ds[self.response_column]
        return [from_pair(p, r, f"{split} row {i}") for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# --- finding and loading ----------------------------------------------------------------------------------------


def resolve_source(spec: DataSpec) -> tuple[str, list[str] | None]:
    """('csv'|'json'|'parquet'|'text', files) for local and embedded data, or ('hub', None) for a Hub id."""
    source = spec.source
    if source.startswith(EMBEDDED_PREFIX):
        try:
            path, fmt = embedded_dataset(source[len(EMBEDDED_PREFIX) :])
        except ValueError as e:
            raise DataError(f"data.source: {e}") from None
        return fmt, [str(path)]
    path = Path(os.path.expanduser(source))
    if path.exists():
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIX_FORMATS)
        if not files:
            raise DataError(f"data.source: the folder {source!r} has no data files ({', '.join(SUFFIX_FORMATS)})")
        fmt = spec.format
        if fmt == "auto":
            fmts = {SUFFIX_FORMATS.get(p.suffix) for p in files}
            if None in fmts or len(fmts) != 1:
                raise DataError(
                    f"data.source: cannot tell the format of {source!r} from its suffix; set data.format to one "
                    "of csv, json, parquet, text"
                )
            fmt = fmts.pop()
        return fmt, [str(p) for p in files]
    if source.startswith((".", "/", "~")) or Path(source).suffix in SUFFIX_FORMATS:
        raise DataError(f"data.source: the file or folder {source!r} does not exist")
    return "hub", None


def _check_hub_dataset(spec: DataSpec) -> None:
    from ortlab.hub import HubUnavailable, hub_repo_exists

    try:
        exists = hub_repo_exists(spec.source, repo_type="dataset")
    except HubUnavailable as e:
        raise DataError(
            f"data.source: {spec.source!r} is not a local file or folder, and the Hugging Face Hub is not "
            f"reachable ({e}). Use a local file, an embedded dataset (embedded:rotten-tomatoes), or go online."
        ) from None
    if not exists:
        raise DataError(f"data.source: no dataset {spec.source!r} on the Hugging Face Hub (check the id)")


def load_raw(spec: DataSpec) -> tuple[dict[str, Dataset], list[str]]:
    """Load every split of the source. Local files become one 'train' split."""
    import datasets

    fmt, files = resolve_source(spec)
    try:
        if fmt == "hub":
            _check_hub_dataset(spec)
            loaded = datasets.load_dataset(spec.source, spec.config_name)
        else:
            kw = {"delimiter": "\t"} if files and all(f.endswith(".tsv") for f in files) else {}
            loaded = datasets.load_dataset(fmt, data_files={"train": files}, **kw)
    except DataError:
        raise
    except Exception as e:
        if "corresponds to no data" in str(e):  # datasets' words for a file with a header and no rows
            raise DataError(f"data.source: {spec.source!r} is empty (no rows)") from None
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise DataError(f"data.source: could not read {spec.source!r} as {fmt}: {first}") from None
    return dict(loaded), files or []


# --- checking against the task ---------------------------------------------------------------------------------


def _pick(columns: list[str], preferred: tuple[str, ...]) -> str | None:
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in preferred if n in lowered), None)


def _is_string(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _is_string_list(feature: Any) -> bool:
    inner = getattr(feature, "feature", None)
    return inner is not None and _is_string(inner)


def _looks_like_labels(values: list[Any]) -> bool:
    """Few distinct short values, each repeated: a class column (e.g. 'priority': urgent/normal)."""
    present = [v for v in values if v is not None]
    distinct = {str(v) for v in present}
    if not present or isinstance(present[0], (list, dict, float)) or len(distinct) < 2:
        return False
    return len(distinct) <= min(100, max(2, len(present) // 3)) and max(len(d) for d in distinct) <= 40


def propose_mapping(dataset: Dataset) -> dict[str, str | None]:
    """Guess text / text pair / label columns and the task from column names, types and (a sample of) values."""
    features = dataset.features
    columns = list(features)
    chat = _chat_columns(dataset)
    if chat is not None:
        return {
            "text_column": None,
            "text_pair_column": None,
            "label_column": None,
            "task": "causal-lm",
            "source_column": None,
            "target_column": None,
            **chat,
        }
    none = {"messages_column": None, "prompt_column": None, "response_column": None}
    text = _pick(columns, TEXT_NAMES)
    if text is None:
        text = next((c for c in columns if _is_string(features[c]) or _is_string_list(features[c])), None)
    label = _pick([c for c in columns if c != text], LABEL_NAMES)
    if label is None:  # no telling name: a column whose values look like classes
        sample = dataset.select(range(min(1000, len(dataset))))
        label = next((c for c in columns if c != text and _looks_like_labels(sample[c])), None)
    pair = _pick([c for c in columns if c not in (text, label)], PAIR_NAMES)
    source, target = _seq2seq_columns(dataset)
    if source is not None and target is not None and _is_string(features[source]) and _is_string(features[target]):
        # A text column and a target column of free text (not a few repeated classes): text in, text out.
        sample = dataset.select(range(min(1000, len(dataset))))
        if not _looks_like_labels(sample[target]):
            return {
                "text_column": None,
                "text_pair_column": None,
                "label_column": None,
                "task": "seq2seq",
                "source_column": source,
                "target_column": target,
                **none,
            }
    if text is not None and _is_string_list(features[text]):
        task = "token-classification"
    elif label is None:
        task = "causal-lm"
    else:
        task = "sequence-classification"
    return {
        "text_column": text,
        "text_pair_column": pair,
        "label_column": label,
        "task": task,
        "source_column": None,
        "target_column": None,
        **none,
    }


def _is_messages(feature: Any) -> bool:
    """A column of conversations: a list of {role, content} structs (what datasets makes of JSON turns)."""
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    return isinstance(inner, dict) and "role" in inner and "content" in inner


def _chat_columns(dataset: Dataset) -> dict[str, str | None] | None:
    """Chat columns by TRL's conventions: a `messages` column of turns, or `prompt` + `completion` (or a prompt /
    instruction column with a response / answer one) of text. None when the data does not look like chat."""
    features = dataset.features
    columns = list(features)
    messages = next((c for c in columns if _is_messages(features[c])), None)
    if messages is not None:
        return {"messages_column": messages, "prompt_column": None, "response_column": None}
    prompt = _pick(columns, PROMPT_NAMES)
    response = _pick([c for c in columns if c != prompt], RESPONSE_NAMES)
    if prompt and response and _is_string(features[prompt]) and _is_string(features[response]):
        return {"messages_column": None, "prompt_column": prompt, "response_column": response}
    return None


def _misshapen_messages(dataset: Dataset) -> dict[str, str | None] | None:
    """A column named like conversations (messages, conversations, ...) that holds lists, but not of {role,
    content} turns (e.g. a list of strings): chat data gone wrong, not raw text. Taken as the messages column so
    that the row check names the first bad row and the shape it needs."""
    features = dataset.features
    name = _pick([c for c in features if getattr(features[c], "feature", None) is not None], MESSAGES_NAMES)
    return None if name is None else {"messages_column": name, "prompt_column": None, "response_column": None}


def check_chat(raw: dict[str, Dataset], spec: DataSpec) -> dict[str, str | None] | None:
    """The chat columns of a causal-lm run ({messages_column} or {prompt_column, response_column}), or None for
    raw text; every row of both splits checked (cheap: no tokenizer), naming the first bad row."""
    from ortlab.chat import ChatDataError, check_messages, from_pair

    if spec.text_column is not None:
        return None
    train = raw[spec.train_split]
    columns = list(train.features)
    given = {k: getattr(spec, k) for k in ("messages_column", "prompt_column", "response_column")}
    chat = given if any(given.values()) else _chat_columns(train) or _misshapen_messages(train)
    if chat is None:
        return None
    for role, col in chat.items():
        if col is not None and col not in columns:
            raise DataError(f"data.{role}: no column {col!r}; the data has columns {columns}")
    splits = [(spec.train_split, train)] + ([(spec.eval_split, raw[spec.eval_split])] if spec.eval_split else [])
    try:
        for split, ds in splits:
            if chat["messages_column"]:
                for i, value in enumerate(ds[chat["messages_column"]]):
                    check_messages(value, f"data.messages_column: {split!r} row {i}")
            else:
                for i, (p, r) in enumerate(zip(ds[chat["prompt_column"]], ds[chat["response_column"]], strict=True)):
                    from_pair(p, r, f"data.prompt_column/response_column: {split!r} row {i}")
    except ChatDataError as e:
        raise DataError(str(e)) from None
    return chat


def _seq2seq_columns(dataset: Dataset) -> tuple[str | None, str | None]:
    """(source, target) columns guessed from their names, or None for what none of the names fits. Their types are
    checked by whoever uses them: a 'target' column of numbers is reported as not text, not as missing."""
    columns = list(dataset.features)
    target = _pick(columns, TARGET_NAMES)
    source = _pick([c for c in columns if c != target], SOURCE_NAMES)
    return source, target


def check(raw: dict[str, Dataset], spec: DataSpec, task: str) -> tuple[str, str | None, str | None]:
    """The (text, pair, label) columns to use, or a DataError naming the problem."""
    if spec.train_split not in raw:
        raise DataError(f"data.train_split: no split {spec.train_split!r}; the data has {sorted(raw)}")
    train = raw[spec.train_split]
    if len(train) == 0:
        raise DataError(f"data.source: the {spec.train_split!r} split of {spec.source!r} is empty")
    features = train.features
    columns = list(features)
    guess = propose_mapping(train)
    text = spec.text_column or guess["text_column"]
    label = None if task == "causal-lm" else (spec.label_column or guess["label_column"])
    pair = spec.text_pair_column
    for role, col in (("text_column", text), ("text_pair_column", pair), ("label_column", label)):
        if col is not None and col not in columns:
            raise DataError(f"data.{role}: no column {col!r}; the data has columns {columns}")
    if text is None:
        raise DataError(f"data.text_column: found no text column among {columns}; set data.text_column")
    if task == "token-classification":
        if not _is_string_list(features[text]):
            raise DataError(
                f"data.text_column: token classification needs a column of word lists, but {text!r} holds "
                f"{features[text]}; use task sequence-classification for whole texts"
            )
    elif not _is_string(features[text]):
        raise DataError(
            f"data.text_column: column {text!r} is not text (it holds {features[text]}); name a text column"
        )
    if pair is not None and not _is_string(features[pair]):
        raise DataError(f"data.text_pair_column: column {pair!r} is not text (it holds {features[pair]})")
    if task != "causal-lm" and label is None:
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
    guess_source, guess_target = _seq2seq_columns(train)
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
        if not _is_string(features[col]):
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
            missing = [i for i, v in enumerate(ds[col]) if v is None]
            if missing:
                raise DataError(
                    f"data.{role}: {len(missing)} row(s) of the {split!r} split have no {col!r} (first: row "
                    f"{missing[0]}); fill or drop them"
                )
    return source, target


def label_names(train: Dataset, label: str, task: str) -> list[str]:
    """Sorted label names; checks the labels fit the task (several classes, no regression targets)."""
    feature = train.features[label]
    names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    if names:
        return list(names)
    values = train[label]
    if task == "token-classification":
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
    return sorted(flat, key=lambda s: (not s.lstrip("-").isdigit(), int(s) if s.lstrip("-").isdigit() else 0, s))


def load_and_check(spec: DataSpec, task: str, seed: int) -> Prepared:
    """Load the data, check it against the task, split and cap it. No model, no tokenizer needed."""
    raw, files = load_raw(spec)
    target = None
    chat = None
    if task == "causal-lm":
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
    elif task == "seq2seq":
        (text, target), pair, label = check_seq2seq(raw, spec), None, None
    else:
        text, pair, label = check(raw, spec, task)
    train = raw[spec.train_split]
    splits = [(spec.train_split, train)] + ([(spec.eval_split, raw[spec.eval_split])] if spec.eval_split else [])
    if chat is None:
        read = {"source": text, "target": target} if task == "seq2seq" else {"text": text, "text_pair": pair}
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
        split = train.train_test_split(test_size=spec.eval_fraction, seed=seed)
        train, evaluation = split["train"], split["test"]
    if spec.max_train_samples:
        train = train.shuffle(seed=seed).select(range(min(spec.max_train_samples, len(train))))
    if spec.max_eval_samples:
        evaluation = evaluation.select(range(min(spec.max_eval_samples, len(evaluation))))
    names = label_names(train, label, task) if label else []
    if label:
        _check_labels_known(evaluation, label, task, names, "eval split")
    return Prepared(train, evaluation, text, pair, label, names, files, target, **(chat or {}), packing=spec.packing)


def _check_values(ds: Dataset, split: str, task: str, **columns: str | None) -> None:
    """Every row has a value in each column the run reads, and the text is not mostly empty.

    A missing value (an empty CSV cell, a JSON null) would stop the run inside the tokenizer or the label mapping
    after the model has loaded; a text column that is mostly empty strings trains a classifier on nothing but
    [CLS] [SEP], silently. Row numbers count the split's data rows from 0 (the header is not a row)."""
    for role, col in columns.items():
        if col is None or col not in ds.column_names:
            continue
        values = ds[col]
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise DataError(
                f"data.{role}_column: {len(missing)} of {len(values)} row(s) of the {split!r} split have no {col!r} "
                f"(first: row {missing[0]}); fill or drop those rows"
            )
        if role == "label" or (role == "text" and task == "causal-lm"):
            continue  # raw text for a causal LM has blank lines between paragraphs: they are skipped
        empty = sum(1 for v in values if (not v.strip() if isinstance(v, str) else not v))
        if values and empty * 2 > len(values):
            raise DataError(
                f"data.{role}_column: {empty} of {len(values)} rows of the {split!r} split have an empty {col!r}, "
                f"so the model would learn from nothing; is {col!r} the right column? (set data.{role}_column)"
            )


def _check_labels_known(ds: Dataset, label: str, task: str, names: list[str], where: str) -> None:
    """Every label in `ds` must be one of the classes the model is built with (from the training split).

    A label seen only in evaluation would crash after the model has loaded (or, as an integer, be passed on
    unmapped and compared against the wrong class): say so now, naming the labels.
    """
    feature = ds.features[label]
    class_names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    values = ds[label]
    flat = [t for row in values for t in row] if task == "token-classification" else values
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


# --- tokenizing --------------------------------------------------------------------------------------------------


def tokenize(
    prepared: Prepared, tokenizer: Any, task: str, max_length: int, max_target_length: int | None = None
) -> tuple[Dataset, Dataset]:
    """Token ids (and label ids) for both splits; the original columns are dropped. For seq2seq, `max_length`
    cuts the source and `max_target_length` (default: `max_length`) the target."""
    if prepared.chat:
        return _tokenize_chat(prepared, tokenizer, max_length)
    index = {name: i for i, name in enumerate(prepared.label_names)}
    text, pair, label = prepared.text_column, prepared.text_pair_column, prepared.label_column

    def to_id(value: Any) -> int:
        return index[str(value)] if not isinstance(value, int) or str(value) in index else value

    if task == "sequence-classification":

        def fn(batch: dict) -> dict:
            args = (batch[text], batch[pair]) if pair else (batch[text],)
            out = tokenizer(*args, truncation=True, max_length=max_length)
            out["labels"] = [to_id(v) for v in batch[label]]
            return out

    elif task == "token-classification":

        def fn(batch: dict) -> dict:
            out = tokenizer(batch[text], is_split_into_words=True, truncation=True, max_length=max_length)
            all_labels = []
            for i, tags in enumerate(batch[label]):
                previous, row = None, []
                for word in out.word_ids(i):
                    # Label the first sub-token of each word; -100 (ignored) for the rest and special tokens.
                    row.append(-100 if word is None or word == previous else to_id(tags[word]))
                    previous = word
                all_labels.append(row)
            out["labels"] = all_labels
            return out

    elif task == "seq2seq":
        target = prepared.target_column

        def fn(batch: dict) -> dict:
            out = tokenizer(batch[text], truncation=True, max_length=max_length)
            # text_target: tokenizers with a separate target vocabulary (Marian) switch to it for the labels
            labels = tokenizer(text_target=batch[target], truncation=True, max_length=max_target_length or max_length)
            out["labels"] = labels["input_ids"]
            return out

    else:  # causal-lm: concatenate and cut into blocks of max_length

        def fn(batch: dict) -> dict:
            ids = tokenizer([t for t in batch[text] if t and t.strip()])["input_ids"]
            eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
            flat = [tok for row in ids for tok in row + eos]
            n = (len(flat) // max_length) * max_length
            blocks = [flat[i : i + max_length] for i in range(0, n, max_length)]
            return {"input_ids": blocks, "attention_mask": [[1] * max_length for _ in blocks], "labels": blocks}

    def run(ds: Dataset, what: str) -> Dataset:
        return ds.map(fn, batched=True, remove_columns=ds.column_names, desc=f"tokenizing {what}")

    train, evaluation = run(prepared.train, "train"), run(prepared.eval, "eval")
    if len(train) == 0:
        raise DataError(
            f"data: no training examples after tokenizing (causal LM needs at least {max_length} tokens of text; "
            "lower hyper.max_length or add text)"
        )
    return train, evaluation


def _tokenize_chat(prepared: Prepared, tokenizer: Any, max_length: int) -> tuple[Dataset, Dataset]:
    """Conversations rendered with the chat template; labels on the assistant's tokens only; packed on request
    (training split only: evaluation scores each example on its own, so the same examples give the same loss)."""
    from ortlab.chat import ChatDataError, check_messages, encode, from_pair, pack, strip_labels

    if not tokenizer.is_fast:
        raise DataError("chat data needs a fast tokenizer (it maps tokens to characters); this one is not")
    messages, prompt, response = prepared.messages_column, prepared.prompt_column, prepared.response_column

    def fn(batch: dict) -> dict:
        if messages:
            convs = [check_messages(m, "row") for m in batch[messages]]
        else:
            convs = [from_pair(p, r, "row") for p, r in zip(batch[prompt], batch[response], strict=True)]
        rows = [encode(tokenizer, c, max_length) for c in convs]
        return {"input_ids": [r["input_ids"] for r in rows], "labels": [r["labels"] for r in rows]}

    def packed(batch: dict) -> dict:
        return pack(batch["input_ids"], batch["labels"], max_length)

    def run(ds: Dataset, what: str) -> Dataset:
        try:
            out = ds.map(fn, batched=True, remove_columns=ds.column_names, desc=f"formatting chat {what}")
        except ChatDataError as e:
            raise DataError(f"data: {e}") from None
        return strip_labels(out)

    train, evaluation = run(prepared.train, "train"), run(prepared.eval, "eval")
    if len(train) == 0:
        raise DataError(
            f"data: no training example keeps an assistant token within hyper.max_length={max_length}; raise "
            "hyper.max_length or shorten the prompts"
        )
    if prepared.packing:
        train = train.map(packed, batched=True, batch_size=1000, desc="packing train")
    return train, evaluation


def collator(
    task: str,
    tokenizer: Any,
    model: Any = None,
    prepared: Prepared | None = None,
    pad_to_multiple_of: int | None = None,
) -> Any:
    """The batch collator of `task` (chat data: its own). `pad_to_multiple_of` pads each batch's length up to a
    multiple (torch.compile runs use 8: fewer distinct shapes for Dynamo to compile for, and lengths that tensor
    cores tile evenly)."""
    from transformers import (
        DataCollatorForSeq2Seq,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        default_data_collator,
    )

    if prepared is not None and prepared.chat:
        if prepared.packing:
            from ortlab.chat import PackedCollator

            return PackedCollator(tokenizer.pad_token_id)
        # Examples of different lengths: ids padded with the pad token, labels with -100 (out of the loss).
        return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=pad_to_multiple_of)
    if task == "seq2seq":
        # Labels padded with -100 (left out of the loss); with the model, decoder_input_ids are built from the
        # labels here, as the model would shift them itself.
        return DataCollatorForSeq2Seq(
            tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=pad_to_multiple_of
        )
    if task == "sequence-classification":
        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    if task == "token-classification":
        return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    return default_data_collator  # causal LM blocks all have the same length
