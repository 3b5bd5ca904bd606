"""Datasets: find the source, load it, check it fits the task, split, map labels, tokenize, collate.

Two halves, each in its own modules: loading and checking (`load`, `columns`, `checks`: `load_and_check` does
everything that can be checked without a model, so a bad column or an empty file fails before a model is loaded)
and turning the checked data into model inputs (`inputs`: tokenize, chat formatting and packing, collators).
`prepared` holds what passes between them. Every name is here too, so callers import from `ortlab.data`; a test
that replaces a function patches the module that looks it up (e.g. `ortlab.data.checks.load_raw`).
"""

from __future__ import annotations

from ortlab.data.checks import check_chat, check_columns, check_seq2seq, label_names, load_and_check
from ortlab.data.columns import (
    LABEL_NAMES,
    MESSAGES_NAMES,
    PAIR_NAMES,
    PROMPT_NAMES,
    RESPONSE_NAMES,
    SOURCE_NAMES,
    TARGET_NAMES,
    TEXT_NAMES,
    propose_mapping,
)
from ortlab.data.inputs import collator, tokenize
from ortlab.data.load import SUFFIX_FORMATS, load_raw, resolve_source
from ortlab.data.prepared import DataError, Prepared

__all__ = [
    "LABEL_NAMES",
    "MESSAGES_NAMES",
    "PAIR_NAMES",
    "PROMPT_NAMES",
    "RESPONSE_NAMES",
    "SOURCE_NAMES",
    "SUFFIX_FORMATS",
    "TARGET_NAMES",
    "TEXT_NAMES",
    "DataError",
    "Prepared",
    "check_chat",
    "check_columns",
    "check_seq2seq",
    "collator",
    "label_names",
    "load_and_check",
    "load_raw",
    "propose_mapping",
    "resolve_source",
    "tokenize",
]
