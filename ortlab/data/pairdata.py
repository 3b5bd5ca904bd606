"""Task preference's data before any model: the shape found (`ortlab.data.pairs.propose_pairs_mapping`), every row
of the splits used checked (`ortlab.data.pairchecks.check_rows`: a bad pair fails here, naming its row), then split
and capped as the other tasks' data is (`ortlab.data.checks.load_and_check` hands preference data here)."""

from __future__ import annotations

from typing import Any

from ortlab.chat import ChatDataError
from ortlab.data.columnar import hold_out
from ortlab.data.pairchecks import check_rows
from ortlab.data.pairs import propose_pairs_mapping
from ortlab.data.prepared import DataError, Prepared


def check_pairs(raw: dict[str, Any], files: list[str], spec: Any, seed: int) -> Prepared:
    """The checked train and eval splits of preference data (`spec`: a DataSpec), with the mapping found."""
    if any(not hasattr(ds, "__len__") for ds in raw.values()):
        raise DataError("data.streaming: preference data is checked row by row before training; read it whole")
    for field, split in (("train_split", spec.train_split), ("eval_split", spec.eval_split)):
        if split is not None and split not in raw:
            raise DataError(f"data.{field}: no split {split!r}; the data has {sorted(raw)}")
    train = raw[spec.train_split]
    if len(train) == 0:
        raise DataError(f"data.source: the {spec.train_split!r} split of {spec.source!r} is empty")
    mapping = propose_pairs_mapping(train)
    if spec.eval_split is not None:
        evaluation = raw[spec.eval_split]
    else:
        if len(train) < 2:
            raise DataError("data.source: need at least 2 rows to hold some out for evaluation")
        train, evaluation = hold_out(train, spec.eval_fraction, seed)
    if spec.max_train_samples:
        train = train.shuffle(seed=seed).select(range(min(spec.max_train_samples, len(train))))
    if spec.max_eval_samples:
        evaluation = evaluation.select(range(min(spec.max_eval_samples, len(evaluation))))
    for where, ds in (("data (train split)", train), ("data (eval split)", evaluation)):
        try:
            check_rows(ds, mapping, where)
        except ChatDataError as e:
            raise DataError(str(e)) from None
    return Prepared(train, evaluation, None, None, None, source_files=files, pairs=mapping)


def check_loss_fits(mapping: Any, loss: str) -> None:
    """The data's shape must be one the loss trains on: KTO answers labelled good or bad, the other losses pairs of
    a chosen and a rejected answer; SFT shapes (conversations, instructions) are causal-lm's."""
    from ortlab.data.pairs import IMPLICIT, KTO, PREFERENCE

    paired = mapping.shape in (PREFERENCE, IMPLICIT)
    if loss == "kto" and mapping.shape != KTO:
        raise DataError(
            f"preference.loss: kto trains on answers labelled good or bad (prompt, completion, label), but the data is "
            f"{mapping.shape or 'of no preference shape'} ({mapping.found}); use loss dpo, ipo or orpo for pairs"
        )
    if loss != "kto" and not paired:
        raise DataError(
            f"preference.loss: {loss} trains on pairs of a chosen and a rejected answer, but the data is "
            f"{mapping.shape or 'of no preference shape'} ({mapping.found}); "
            + ("use loss kto" if mapping.shape == KTO else "give prompt/chosen/rejected columns, or use task causal-lm")
        )
