"""Preference, KTO and instruction rows (`ortlab.data.pairs`' internal rows) as token ids and labels, and a view of
one rendered example with the tokens that carry loss marked, for the workbench's preview.

Each side is the prompt and its answer rendered with the tokenizer's chat template, and labelled the way ortlab's
chat data is (`ortlab.chat.assistant_spans`: the assistant's content and its end-of-turn marker), but only in the
answer: an assistant turn inside the prompt (an earlier reply of a multi-turn prompt) is context, not trained, as in
TRL's `DPOTrainer`, whose loss covers the completion alone.

Truncation follows TRL 1.16's default (`truncation_mode="keep_start"`, its only mode not deprecated): prompt and
answer are cut to their first `max_length` tokens, so the end of a long answer goes and the prompt stays whole. A
prompt that fills `max_length` leaves no answer token: TRL drops such rows quietly, ortlab refuses them by index
(`ortlab.data.pairchecks.check_prompt_lengths`; `prompt_length` is kept in each tokenized row for that).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ortlab.chat import IGNORE, ChatDataError, assistant_spans
from ortlab.data.pairchecks import check_prompt_lengths, check_rows
from ortlab.data.pairs import PairsMapping, normalize_row

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

Messages = list[dict[str, str]]


@dataclass
class Side:
    """One rendered sequence: its token ids, labels (IGNORE outside the answer) and each token's text, uncut;
    `prompt_length`: the tokens before the first one trained."""

    input_ids: list[int]
    labels: list[int]
    pieces: list[str]
    prompt_length: int


def encode_side(tokenizer: Any, messages: Messages, answer_from: int) -> Side:
    """`messages` rendered with the chat template; labels on the assistant turns from index `answer_from` on."""
    text, spans = assistant_spans(tokenizer, messages)
    assistant_turns = [i for i, t in enumerate(messages) if t["role"] == "assistant"]
    spans = [span for i, span in zip(assistant_turns, spans, strict=True) if i >= answer_from]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
    ids, labels, pieces, last = enc["input_ids"], [], [], 0
    for tok, (start, end) in zip(ids, enc["offset_mapping"], strict=True):
        inside = any(a <= start < b for a, b in spans) and end > start
        labels.append(tok if inside else IGNORE)
        # each character once: text a tokenizer skipped goes with the next token, and a character split over
        # several byte-level tokens (their offsets overlap) with the first of them
        pieces.append(text[last:end] if end > last else "")
        last = max(last, end)
    first = next((i for i, lab in enumerate(labels) if lab != IGNORE), len(labels))
    return Side(ids, labels, pieces, first)


def encode_preference(row: dict[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """{chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels, prompt_length} of a {prompt, chosen,
    rejected} row, each side cut to its first `max_length` tokens."""
    n = len(row["prompt"])
    chosen = encode_side(tokenizer, row["prompt"] + row["chosen"], n)
    rejected = encode_side(tokenizer, row["prompt"] + row["rejected"], n)
    return {
        "chosen_input_ids": chosen.input_ids[:max_length],
        "chosen_labels": chosen.labels[:max_length],
        "rejected_input_ids": rejected.input_ids[:max_length],
        "rejected_labels": rejected.labels[:max_length],
        "prompt_length": max(chosen.prompt_length, rejected.prompt_length),
    }


def encode_unpaired(row: dict[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """{input_ids, labels, label, prompt_length} of a KTO {prompt, completion, label} row, cut to `max_length`."""
    side = encode_side(tokenizer, row["prompt"] + row["completion"], len(row["prompt"]))
    return {
        "input_ids": side.input_ids[:max_length],
        "labels": side.labels[:max_length],
        "label": bool(row["label"]),
        "prompt_length": side.prompt_length,
    }


def encode_conversation(row: dict[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """{input_ids, labels, prompt_length} of an instruction row ({messages}: ShareGPT, Alpaca), every assistant
    turn trained, as `ortlab.chat.encode` does."""
    side = encode_side(tokenizer, row["messages"], 0)
    return {
        "input_ids": side.input_ids[:max_length],
        "labels": side.labels[:max_length],
        "prompt_length": side.prompt_length,
    }


def encode_row(row: dict[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """An internal row of any shape, encoded by the function for it."""
    if "chosen" in row:
        return encode_preference(row, tokenizer, max_length)
    if "completion" in row:
        return encode_unpaired(row, tokenizer, max_length)
    return encode_conversation(row, tokenizer, max_length)


def prompt_and_answer(row: dict[str, Any]) -> tuple[Messages, Messages]:
    """(the prompt, the answer trained toward) of an internal row: a pair's chosen answer, a KTO row's answer, or a
    conversation cut before its last assistant turn."""
    if "chosen" in row:
        return row["prompt"], row["chosen"]
    if "completion" in row:
        return row["prompt"], row["completion"]
    last = max(i for i, turn in enumerate(row["messages"]) if turn["role"] == "assistant")
    return row["messages"][:last], row["messages"][last:]


def lm_rows(prepared: Any, tokenizer: Any, max_length: int, n: int) -> list[dict[str, Any]]:
    """Up to `n` held-out rows as a causal LM's rows, for what takes example inputs from a run's data (the exports'
    parity checks; task preference's `lm_rows`): the prompt with the chosen answer (KTO: its answer, the desirable
    ones first), encoded as training encodes that side (`encode_side`, cut to `max_length`), and `prompt`, the
    prompt alone rendered with the chat template's generation prompt: what the aligned model is asked at inference.
    The chosen side because it is what the run trained the model toward; the rejected one is no less valid input,
    but a check needs one row per pair."""
    rows = [normalize_row(prepared.eval[i], prepared.pairs) for i in range(min(len(prepared.eval), 20 * n))]
    rows.sort(key=lambda row: not row.get("label", True))  # KTO: desirable answers first (a stable sort)
    out = []
    for row in rows[:n]:
        prompt, answer = prompt_and_answer(row)
        side = encode_side(tokenizer, prompt + answer, len(prompt))
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        out.append({"input_ids": side.input_ids[:max_length], "prompt": text})
    return out


def tokenize_pairs(
    dataset: Dataset, mapping: PairsMapping, tokenizer: Any, max_length: int, where: str = "data"
) -> Dataset:
    """The rows checked (`check_rows`), read into the internal shape, encoded, and their prompt lengths checked:
    the columns of `encode_preference`, `encode_unpaired` or `encode_conversation` for the shape."""
    check_rows(dataset, mapping, where)
    tokenized = dataset.map(
        lambda row: encode_row(normalize_row(row, mapping), tokenizer, max_length),
        remove_columns=dataset.column_names,
        desc=f"Tokenizing {mapping.shape} data",
    )
    check_prompt_lengths(tokenized, max_length, where)
    return tokenized


def tokenize_prepared(
    prepared: Any, tokenizer: Any, task: str, max_length: int, max_target_length: int | None = None
) -> tuple[Dataset, Dataset]:
    """Both splits of checked preference data (`ortlab.data.pairdata.check_pairs`) encoded: task preference's
    `tokenize` (the signature of `ortlab.data.inputs.tokenize`). A prompt that fills max_length fails here, naming
    its rows, before training."""
    from ortlab.data.prepared import DataError

    try:
        return (
            tokenize_pairs(prepared.train, prepared.pairs, tokenizer, max_length, "data (train split)"),
            tokenize_pairs(prepared.eval, prepared.pairs, tokenizer, max_length, "data (eval split)"),
        )
    except ChatDataError as e:
        raise DataError(str(e)) from None


# --- one rendered example, for the preview ---------------------------------------------------------------------


@dataclass
class RenderedExample:
    """One example as the model will see it: per side (chosen, rejected; or the one sequence), its token texts
    and whether each carries loss; `html` and `text` show them with the loss tokens marked."""

    sides: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)  # tokens past max_length, per side
    html: str = ""
    text: str = ""


LOSS_OPEN, LOSS_CLOSE = "⟦", "⟧"  # the plain-text marks around the tokens that carry loss
LOSS_STYLE = "background:#fde68a;color:#111;border-radius:2px"


def rendered_example(
    row: dict[str, Any], tokenizer: Any, max_length: int, mapping: PairsMapping | None = None
) -> RenderedExample:
    """A view of one row as it is trained: an internal row (or a raw one, with its `mapping`) rendered with the
    chat template and cut to `max_length`, its loss tokens marked: `html` (every token's text escaped; loss tokens
    in a highlighted span) and `text` (loss tokens between ⟦ and ⟧)."""
    if mapping is not None:
        row = normalize_row(row, mapping)
    if "chosen" in row:
        n = len(row["prompt"])
        parts = {"chosen": (row["prompt"] + row["chosen"], n), "rejected": (row["prompt"] + row["rejected"], n)}
    elif "completion" in row:
        name = "desirable" if row["label"] else "undesirable"
        parts = {name: (row["prompt"] + row["completion"], len(row["prompt"]))}
    else:
        parts = {"conversation": (row["messages"], 0)}
    out = RenderedExample()
    html_parts, text_parts = [], []
    for name, (messages, answer_from) in parts.items():
        side = encode_side(tokenizer, messages, answer_from)
        tokens = [(p, lab != IGNORE) for p, lab in zip(side.pieces, side.labels, strict=True)]
        out.sides[name], out.cut[name] = tokens[:max_length], max(0, len(tokens) - max_length)
        html_parts.append(_html_side(name, out.sides[name], out.cut[name]))
        text_parts.append(_text_side(name, out.sides[name], out.cut[name]))
    out.html = "".join(html_parts)
    out.text = "\n\n".join(text_parts)
    return out


def _runs(tokens: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Neighbouring tokens of the same kind joined: one highlighted span per answer, not one per token."""
    runs: list[tuple[str, bool]] = []
    for piece, trained in tokens:
        if runs and runs[-1][1] == trained:
            runs[-1] = (runs[-1][0] + piece, trained)
        else:
            runs.append((piece, trained))
    return runs


def _cut_note(cut: int) -> str:
    return f"… {cut} more tokens cut at max_length" if cut else ""


def _html_side(name: str, tokens: list[tuple[str, bool]], cut: int) -> str:
    trained = sum(t for _, t in tokens)
    body = "".join(
        f'<span class="ortlab-loss" style="{LOSS_STYLE}">{html.escape(p)}</span>' if t else html.escape(p)
        for p, t in _runs(tokens)
    )
    note = f'<div class="ortlab-cut">{html.escape(_cut_note(cut))}</div>' if cut else ""
    return (
        f'<div class="ortlab-rendered"><div><b>{html.escape(name)}</b>: {len(tokens)} tokens, {trained} with loss'
        f'</div><pre style="white-space:pre-wrap;margin:0">{body}</pre>{note}</div>'
    )


def _text_side(name: str, tokens: list[tuple[str, bool]], cut: int) -> str:
    trained = sum(t for _, t in tokens)
    body = "".join(f"{LOSS_OPEN}{p}{LOSS_CLOSE}" if t else p for p, t in _runs(tokens))
    note = f"\n{_cut_note(cut)}" if cut else ""
    return f"{name}: {len(tokens)} tokens, {trained} with loss\n{body}{note}"
