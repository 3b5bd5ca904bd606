"""Chat and instruction data for causal LMs: conversations rendered with the tokenizer's chat template, the loss on
the assistant's tokens only, optional packing, and generations to read (with an exact-match score).

The data formats follow TRL's conventions (its "conversational" `messages` column of {role, content} turns, and its
"prompt-completion" pair of columns) without depending on TRL: ortlab's own trainer, collators and run folder stay
as they are (see docs/decisions/lora-and-small-llms.md, "Chat data and small LLMs").

Which tokens the loss covers is found from the template itself, not from its text: the conversation up to an
assistant turn is rendered with `add_generation_prompt=True`, then with the turn; the characters in between are the
assistant's (its content and the end-of-turn marker the template writes), and the tokens that start there are the
ones with labels. This works with any template whose rendering of a shorter conversation is a prefix of a longer
one's (ChatML, Llama, Gemma, SmolLM2 ...); a template that is not gets a clear error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.runfolder import events

IGNORE = -100  # label of a token the loss leaves out (transformers' convention)
ROLES = ("system", "user", "assistant", "tool")
# ChatML, a common template, for the error message's example (SmolLM2's and Qwen's family use it)
CHATML_EXAMPLE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatDataError(OrtlabError, ValueError):
    """Chat data or a tokenizer that cannot be used; the message says what is wrong and how to fix it."""


# --- conversations ---------------------------------------------------------------------------------------------


def check_messages(value: Any, where: str) -> list[dict[str, str]]:
    """A conversation as a list of {role, content} strings, or a ChatDataError naming the row and the problem."""
    if not isinstance(value, list) or not value:
        raise ChatDataError(
            f"{where}: a conversation is a non-empty list of {{role, content}} turns (got {value!r:.80})"
        )
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or "content" not in turn:
            raise ChatDataError(f"{where}, turn {i}: each turn needs a 'role' and a 'content' (got {turn!r:.80})")
        if turn["role"] not in ROLES:
            raise ChatDataError(f"{where}, turn {i}: role {turn['role']!r} is not one of {', '.join(ROLES)}")
        if not isinstance(turn["content"], str):
            raise ChatDataError(f"{where}, turn {i}: 'content' must be text (got {type(turn['content']).__name__})")
        turns.append({"role": turn["role"], "content": turn["content"]})
    if not any(t["role"] == "assistant" for t in turns):
        raise ChatDataError(f"{where}: the conversation has no assistant turn, so there is nothing to learn from it")
    return turns


def from_pair(prompt: Any, response: Any, where: str) -> list[dict[str, str]]:
    """A prompt/response (TRL: prompt/completion) pair as a two-turn conversation."""
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise ChatDataError(f"{where}: prompt and response must both be text (got {prompt!r:.40}, {response!r:.40})")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def require_template(tokenizer: Any, model_name: str) -> None:
    """Chat data needs the tokenizer's chat template: say what to do when the model has none."""
    if getattr(tokenizer, "chat_template", None):
        return
    raise ChatDataError(
        f"model.name: the tokenizer of {model_name!r} has no chat template, so ortlab cannot tell how to lay out "
        "the conversations. Use an instruction-tuned model that has one (e.g. HuggingFaceTB/SmolLM2-135M-Instruct, "
        "embedded), or set `tokenizer.chat_template` and save the tokenizer into the model folder (ChatML: "
        f"{CHATML_EXAMPLE}), or train on raw text instead (set data.text_column to a column that already holds "
        "the formatted prompt and answer)"
    )


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """(the rendered conversation, the character spans of the assistant turns: content and end-of-turn marker)."""
    text = _render(tokenizer, messages, False)
    spans = []
    for i, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True) if i else ""
        upto = _render(tokenizer, messages[: i + 1], False)
        if not text.startswith(upto) or not upto.startswith(before):
            raise ChatDataError(
                "the tokenizer's chat template renders a conversation differently from its beginning (it is not "
                "built turn by turn), so ortlab cannot tell the assistant's tokens apart; use a template that "
                "renders each turn the same way whatever follows (ChatML, for instance)"
            )
        spans.append((len(before), len(upto)))
    return text, spans


def encode(tokenizer: Any, messages: list[dict[str, str]], max_length: int) -> dict[str, list[int]]:
    """input_ids and labels (IGNORE on every token that is not the assistant's), cut to max_length."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
    ids, labels = enc["input_ids"], []
    for tok, (start, end) in zip(ids, enc["offset_mapping"], strict=True):
        inside = any(a <= start < b for a, b in spans) and end > start
        labels.append(tok if inside else IGNORE)
    return {"input_ids": ids[:max_length], "labels": labels[:max_length]}


def pack(input_ids: list[list[int]], labels: list[list[int]], max_length: int) -> dict[str, list[list[int]]]:
    """Short examples packed into rows of at most max_length tokens, in their order; `position_ids` restart at 0
    for each example, which is how transformers tells the examples of a row apart (its attention mask then keeps
    each example from seeing the others)."""
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    cur: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
    for ids, lab in zip(input_ids, labels, strict=True):
        if cur["input_ids"] and len(cur["input_ids"]) + len(ids) > max_length:
            for k in rows:
                rows[k].append(cur[k])
            cur = {"input_ids": [], "labels": [], "position_ids": []}
        cur["input_ids"] += ids
        # The first token of each example predicts nothing from the previous example: its label is never used
        # (labels shift by one inside the model), but the last token of the previous example would predict it.
        cur["labels"] += [IGNORE, *lab[1:]] if cur["labels"] else lab
        cur["position_ids"] += list(range(len(ids)))
    if cur["input_ids"]:
        for k in rows:
            rows[k].append(cur[k])
    return rows


class PackedCollator:
    """Batches of packed rows. No attention_mask: transformers finds the examples from the restarting
    position_ids and builds a block-diagonal causal mask (eager and SDPA alike). The padding at the end of a
    row is one more "example" (positions from 0, labels IGNORE), so it changes nothing that is trained.

    transformers looks for packed examples only when the model runs without a KV cache, as in training (Trainer
    turns `use_cache` off); a forward with the cache on would let the examples of a row see each other."""

    def __init__(self, pad_token_id: int):
        self.pad = pad_token_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        out: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
        for f in features:
            n = width - len(f["input_ids"])
            out["input_ids"].append(list(f["input_ids"]) + [self.pad] * n)
            out["labels"].append(list(f["labels"]) + [IGNORE] * n)
            # an unpacked row (the eval split is never packed) is one example: positions 0..len-1
            positions = f.get("position_ids") or list(range(len(f["input_ids"])))
            out["position_ids"].append(list(positions) + list(range(n)))
        return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}


# --- generations ----------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def strip_controls(text: str) -> str:
    """Control characters other than newline and tab removed (escape sequences, bidi overrides)."""
    return _CONTROL.sub("", text.replace("\t", " "))


def for_terminal(text: str, limit: int = 200) -> str:
    """Model output made safe for a terminal: control characters (escape sequences, bidi overrides, carriage
    returns) become visible as '?', newlines become '⏎', and long text is cut."""
    clean = _CONTROL.sub("?", str(text).replace("\r\n", "\n").replace("\n", " ⏎ "))
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def generation_lines(record: dict[str, Any]) -> list[str]:
    """A `generations` metrics record as terminal lines (`ortlab follow`, the train view), made safe to print."""
    em = record.get("exact_match")
    score = f", exact match {em:.3f} over {record.get('scored')}" if isinstance(em, (int, float)) else ""
    lines = [f"generations {record.get('phase', '')} (step {record.get('step')}){score}:"]
    for item in record.get("items") or []:
        if not isinstance(item, dict):
            continue
        mark = (
            ""
            if "match" not in item
            else ("  [match]" if item["match"] else f"  [expected {for_terminal(item.get('reference', ''), 40)}]")
        )
        lines.append(f"  > {for_terminal(item.get('prompt', ''), 80)}")
        lines.append(f"    {for_terminal(item.get('output', ''))}{mark}")
    return lines


def normalize(text: str) -> str:
    """What exact match compares: lower case, outer whitespace and final punctuation removed."""
    return str(text).strip().lower().rstrip(".!").strip()


def exact_match(predictions: list[str], references: list[str]) -> float:
    if not references:
        return float("nan")
    return sum(normalize(p) == normalize(r) for p, r in zip(predictions, references, strict=True)) / len(references)


def generate(
    model: Any, tokenizer: Any, conversations: list[list[dict[str, str]]], max_new_tokens: int, batch_size: int = 8
) -> list[str]:
    """Greedy replies to each conversation (its last turn is the user's), in batches, left-padded."""
    import torch

    end_ids = {tokenizer.eos_token_id}
    for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            end_ids.add(tid)
    end_ids.discard(None)
    texts = [_render(tokenizer, c, True) if tokenizer.chat_template else c[-1]["content"] for c in conversations]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    replies: list[str] = []
    try:
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    use_cache=True,
                    eos_token_id=sorted(end_ids),
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = out[:, enc["input_ids"].shape[1] :]
            replies += [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return replies


def prompts_for(spec_prompts: list[str] | None, conversations: list[list[dict[str, str]]], n: int):
    """(conversations to answer, their references or None): the user's prompts, or the eval split's first ones
    (each cut before its last assistant turn, whose content is the reference)."""
    if spec_prompts:
        return [[{"role": "user", "content": p}] for p in spec_prompts], [None] * len(spec_prompts)
    asked, refs = [], []
    for conv in conversations[:n]:
        last = max(i for i, t in enumerate(conv) if t["role"] == "assistant")
        asked.append(conv[:last])
        refs.append(conv[last]["content"])
    return asked, refs


def generations_callback(run_path: Path, asked: list, references: list, shown: int, max_new_tokens: int, sink: Any):
    """A TrainerCallback that, at every evaluation, answers the fixed prompts greedily, appends one record per
    shown prompt to the run's generations.jsonl, sends a `generations` record to the metrics stream, and adds
    `eval_exact_match` (over all prompts with a reference) to the evaluation's metrics."""
    from transformers import TrainerCallback

    path = Path(run_path) / "generations.jsonl"

    class Generations(TrainerCallback):
        trainer: Any = None  # set by whoever builds the trainer: its eval_phase tags the records

        def __init__(self) -> None:
            self.sink = sink

        def on_evaluate(self, args, state, control, model=None, processing_class=None, metrics=None, **kwargs):
            if not state.is_world_process_zero or model is None or processing_class is None or not asked:
                return
            outputs = generate(model, processing_class, asked, max_new_tokens)
            phase = getattr(self.trainer, "eval_phase", None) or "during"
            scored = [(o, r) for o, r in zip(outputs, references, strict=True) if r is not None]
            em = exact_match([o for o, _ in scored], [r for _, r in scored]) if scored else None
            if em is not None and metrics is not None:
                metrics["eval_exact_match"] = em
            items = []
            for conv, out, ref in list(zip(asked, outputs, references, strict=True))[:shown]:
                item = {"prompt": conv[-1]["content"], "output": out}
                if ref is not None:
                    item.update(reference=ref, match=normalize(out) == normalize(ref))
                items.append(item)
            with path.open("a", encoding="utf-8") as f:
                for item in items:
                    f.write(json.dumps({"step": state.global_step, "phase": phase, **item}) + "\n")
            self.sink(
                {
                    "event": events.GENERATIONS,
                    "step": state.global_step,
                    "phase": phase,
                    "exact_match": em,
                    "scored": len(scored),
                    "items": items,
                }
            )

    return Generations()


def read_generations(run_path: Path) -> list[dict[str, Any]]:
    """The run's generations.jsonl records (a torn last line is skipped)."""
    path = Path(run_path) / "generations.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the last evaluation (the highest step, the 'after' phase winning over 'during')."""
    records = list(records)
    if not records:
        return []
    key = max((r.get("step", 0), r.get("phase") == "after") for r in records)
    return [r for r in records if (r.get("step", 0), r.get("phase") == "after") == key]
