"""Guessing a dataset's columns and task from column names, types and a sample of values (no spec needed:
`ortlab.discover` proposes a mapping with it before any spec exists)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

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


def _pick(columns: list[str], preferred: tuple[str, ...]) -> str | None:
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in preferred if n in lowered), None)


def is_string(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def is_string_list(feature: Any) -> bool:
    inner = getattr(feature, "feature", None)
    return inner is not None and is_string(inner)


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
    none = {"messages_column": None, "prompt_column": None, "response_column": None}
    if is_preference_data(dataset):  # before chat: a prompt column of turns or prompt + completion look like chat too
        nothing = dict.fromkeys(("text_column", "text_pair_column", "label_column", "source_column", "target_column"))
        return {**nothing, "task": "preference", **none}
    chat = chat_columns(dataset)
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
    text = _pick(columns, TEXT_NAMES)
    if text is None:
        text = next((c for c in columns if is_string(features[c]) or is_string_list(features[c])), None)
    label = _pick([c for c in columns if c != text], LABEL_NAMES)
    if label is None:  # no telling name: a column whose values look like classes
        sample = dataset.select(range(min(1000, len(dataset))))
        label = next((c for c in columns if c != text and _looks_like_labels(sample[c])), None)
    pair = _pick([c for c in columns if c not in (text, label)], PAIR_NAMES)
    source, target = seq2seq_columns(dataset)
    if source is not None and target is not None and is_string(features[source]) and is_string(features[target]):
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
    if text is not None and is_string_list(features[text]):
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


def is_preference_data(dataset: Dataset) -> bool:
    """Data for task preference: prompt + chosen + rejected (text or turns), chosen + rejected conversations
    (UltraFeedback), or KTO's prompt + completion + a label that says good or bad (`ortlab.data.pairs` finds the
    shape and its columns; the task reads them itself, so the proposal names no column)."""
    from ortlab.data.pairs import KTO, PAIRED_SHAPES, RowError, bool_label, propose_pairs_mapping

    found = propose_pairs_mapping(dataset)
    if found.shape in PAIRED_SHAPES:
        return True
    if found.shape != KTO:
        return False
    # A label column of classes (prompt + answer + "positive"/"negative") is not KTO's good/bad: all must read
    # as yes or no.
    column = found.columns["label"]
    try:
        return all(v is not None and bool_label(v, column) in (True, False) for v in _sample(dataset)[column])
    except RowError:
        return False


def _sample(dataset: Dataset) -> Dataset:
    return dataset.select(range(min(1000, len(dataset))))


def _is_messages(feature: Any) -> bool:
    """A column of conversations: a list of {role, content} structs (what datasets makes of JSON turns)."""
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    return isinstance(inner, dict) and "role" in inner and "content" in inner


def chat_columns(dataset: Dataset) -> dict[str, str | None] | None:
    """Chat columns by TRL's conventions: a `messages` column of turns, or `prompt` + `completion` (or a prompt /
    instruction column with a response / answer one) of text. None when the data does not look like chat."""
    features = dataset.features
    columns = list(features)
    messages = next((c for c in columns if _is_messages(features[c])), None)
    if messages is not None:
        return {"messages_column": messages, "prompt_column": None, "response_column": None}
    prompt = _pick(columns, PROMPT_NAMES)
    response = _pick([c for c in columns if c != prompt], RESPONSE_NAMES)
    if prompt and response and is_string(features[prompt]) and is_string(features[response]):
        return {"messages_column": None, "prompt_column": prompt, "response_column": response}
    return None


def misshapen_messages(dataset: Dataset) -> dict[str, str | None] | None:
    """A column named like conversations (messages, conversations, ...) that holds lists, but not of {role,
    content} turns (e.g. a list of strings): chat data gone wrong, not raw text. Taken as the messages column so
    that the row check names the first bad row and the shape it needs."""
    features = dataset.features
    name = _pick([c for c in features if getattr(features[c], "feature", None) is not None], MESSAGES_NAMES)
    return None if name is None else {"messages_column": name, "prompt_column": None, "response_column": None}


def seq2seq_columns(dataset: Dataset) -> tuple[str | None, str | None]:
    """(source, target) columns guessed from their names, or None for what none of the names fits. Their types are
    checked by whoever uses them: a 'target' column of numbers is reported as not text, not as missing."""
    columns = list(dataset.features)
    target = _pick(columns, TARGET_NAMES)
    source = _pick([c for c in columns if c != target], SOURCE_NAMES)
    return source, target
