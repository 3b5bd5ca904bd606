"""Batches for preference training: pairs (DPO, IPO, ORPO) and unpaired labelled answers (KTO).

A pair row is either tokenized pieces, `{prompt_ids, chosen_ids, rejected_ids}` (TRL's shape: the answer is what
follows the prompt), or two rendered sequences, `{chosen_input_ids, chosen_labels, rejected_input_ids,
rejected_labels}` (ortlab's chat rendering: labels are -100 outside the assistant's answer, the assistant-only
masking, so a chat template and its masking apply to chosen and rejected alike). `PairCollator` pads the chosen
sequences and then the rejected ones into one batch of 2N rows, so the model runs once on both.

A KTO row is `{prompt_ids, completion_ids, label}` or `{input_ids, labels, label}` (label: the answer is desirable).
`UnpairedCollator` also builds the KL batch of KTO's reference point: row i's prompt with row i-1's answer (row 0
takes the last row's), the mismatched pairs TRL builds by rotating the answers within each batch.

Padding is on the right; labels are padded with -100, so padding is never scored. Rows may also carry reference
log-probabilities computed once before training (`ref_chosen_logps`/`ref_rejected_logps`, KTO's `ref_logps`): they
are passed through as tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ortlab.train.preference import IGNORE

__all__ = ["PairCollator", "UnpairedCollator", "pad_rows", "split_prompt"]

PASS_THROUGH = ("ref_chosen_logps", "ref_rejected_logps", "ref_logps")


def pad_rows(
    ids: list[list[int]], labels: list[list[int]], pad_token_id: int, pad_to_multiple_of: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad token lists and their labels into `input_ids`, `attention_mask` and `labels` tensors."""
    width = max((len(r) for r in ids), default=0)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    out_labels = torch.full((len(ids), width), IGNORE, dtype=torch.long)
    for i, (row, lab) in enumerate(zip(ids, labels, strict=True)):
        if len(row) != len(lab):
            raise ValueError(f"row {i}: {len(row)} tokens but {len(lab)} labels")
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        out_labels[i, : len(lab)] = torch.tensor(lab, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": out_labels}


def _as_list(x: Any) -> list[int]:
    return x.tolist() if hasattr(x, "tolist") else list(x)


def split_prompt(input_ids: list[int], labels: list[int]) -> tuple[list[int], list[int], list[int]]:
    """A rendered sequence as (prompt ids, answer ids, answer labels): the answer starts at the first trained token."""
    start = next((i for i, v in enumerate(labels) if v != IGNORE), len(labels))
    return input_ids[:start], input_ids[start:], labels[start:]


def _pair_side(row: dict[str, Any], side: str, index: int) -> tuple[list[int], list[int]]:
    if f"{side}_input_ids" in row:
        ids, labels = _as_list(row[f"{side}_input_ids"]), _as_list(row[f"{side}_labels"])
    elif "prompt_ids" in row and f"{side}_ids" in row:
        prompt, answer = _as_list(row["prompt_ids"]), _as_list(row[f"{side}_ids"])
        ids, labels = prompt + answer, [IGNORE] * len(prompt) + answer
    else:
        raise KeyError(
            f"preference row {index} has neither prompt_ids/{side}_ids nor {side}_input_ids/{side}_labels "
            f"(its keys: {sorted(row)})"
        )
    if all(v == IGNORE for v in labels):
        raise ValueError(f"preference row {index}: the {side} answer has no trained token (empty, or cut off)")
    return ids, labels


@dataclass
class PairCollator:
    """Pads a list of pair rows into one batch: rows 0..N-1 the chosen sequences, N..2N-1 the rejected ones.

    `max_length` cuts each sequence's end (the prompt is kept; a row whose answer is cut away entirely is an
    error naming it, since it would carry no signal).
    """

    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        sides: dict[str, tuple[list[list[int]], list[list[int]]]] = {"chosen": ([], []), "rejected": ([], [])}
        for i, row in enumerate(rows):
            for side, (all_ids, all_labels) in sides.items():
                ids, labels = _pair_side(row, side, i)
                if self.max_length is not None:
                    ids, labels = ids[: self.max_length], labels[: self.max_length]
                    if all(v == IGNORE for v in labels):
                        raise ValueError(f"preference row {i}: max_length={self.max_length} cuts off the {side} answer")
                all_ids.append(ids)
                all_labels.append(labels)
        ids = sides["chosen"][0] + sides["rejected"][0]
        labels = sides["chosen"][1] + sides["rejected"][1]
        batch = pad_rows(ids, labels, self.pad_token_id, self.pad_to_multiple_of)
        for key in PASS_THROUGH:
            if key in rows[0]:
                batch[key] = torch.tensor([float(r[key]) for r in rows])
        return batch


def _unpaired_row(row: dict[str, Any], index: int) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, answer ids, answer labels) of a KTO row."""
    if "input_ids" in row and "labels" in row:
        prompt, answer, labels = split_prompt(_as_list(row["input_ids"]), _as_list(row["labels"]))
    elif "prompt_ids" in row and "completion_ids" in row:
        prompt, answer = _as_list(row["prompt_ids"]), _as_list(row["completion_ids"])
        labels = list(answer)
    else:
        raise KeyError(
            f"KTO row {index} has neither prompt_ids/completion_ids nor input_ids/labels (its keys: {sorted(row)})"
        )
    if not answer or all(v == IGNORE for v in labels):
        raise ValueError(f"KTO row {index}: the answer has no trained token")
    if "label" not in row:
        raise KeyError(f"KTO row {index} has no 'label' (True: a desirable answer, False: an undesirable one)")
    return prompt, answer, labels


@dataclass
class UnpairedCollator:
    """Pads KTO rows: `input_ids`, `attention_mask`, `labels`, `label` (bool), and the KL batch `KL_input_ids`,
    `KL_attention_mask`, `KL_labels` (row i's prompt, row i-1's answer). `kl=False` leaves the KL batch out."""

    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    kl: bool = True

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        parts = [_unpaired_row(row, i) for i, row in enumerate(rows)]

        def build(pairs: list[tuple[list[int], list[int], list[int]]]) -> tuple[list[list[int]], list[list[int]]]:
            ids, labels = [], []
            for prompt, answer, answer_labels in pairs:
                row_ids, row_labels = prompt + answer, [IGNORE] * len(prompt) + answer_labels
                if self.max_length is not None:
                    row_ids, row_labels = row_ids[: self.max_length], row_labels[: self.max_length]
                ids.append(row_ids)
                labels.append(row_labels)
            return ids, labels

        batch = pad_rows(*build(parts), self.pad_token_id, self.pad_to_multiple_of)
        batch["label"] = torch.tensor([bool(row["label"]) for row in rows])
        if self.kl:
            shifted = [(parts[i][0], parts[i - 1][1], parts[i - 1][2]) for i in range(len(parts))]
            kl = pad_rows(*build(shifted), self.pad_token_id, self.pad_to_multiple_of)
            batch.update({f"KL_{k}": v for k, v in kl.items()})
        for key in PASS_THROUGH:
            if key in rows[0]:
                batch[key] = torch.tensor([float(r[key]) for r in rows])
        return batch


def collator_for(tokenizer: Any, model: Any = None, prepared: Any = None, pad_to_multiple_of: int | None = None) -> Any:
    """Task preference's collator (its record's `collate`): KTO's for answers labelled good or bad, else pairs'.
    The rows are already cut to max_length (`ortlab.data.pairtokens`)."""
    from ortlab.data.pairs import KTO

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shape = getattr(getattr(prepared, "pairs", None), "shape", None)
    if shape == KTO:
        return UnpairedCollator(pad, pad_to_multiple_of=pad_to_multiple_of)
    return PairCollator(pad, pad_to_multiple_of=pad_to_multiple_of)
