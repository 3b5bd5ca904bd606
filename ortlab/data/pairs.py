"""The shapes of preference and instruction data that users bring, each read into one internal row.

Preference training (DPO, ORPO) learns from a prompt and two answers; KTO from a prompt, one answer and a good/bad
label; SFT from a conversation. Data for them comes in the shapes the other tools wrote down, and ortlab reads each
into one row, made of ortlab's chat messages (`ortlab.chat`: lists of {role, content} turns):

- `preference` -> {prompt, chosen, rejected}: prompt, chosen, rejected as text or as turns (TRL's shapes), or a
  prompt conversation with one {from, value} turn per side (LLaMA-Factory's ShareGPT shape); an `input` column is
  appended to the prompt (LLaMA-Factory's Alpaca shape).
- `preference-implicit` -> {prompt, chosen, rejected}: chosen and rejected as whole conversations (UltraFeedback,
  TRL's "implicit prompt"); the turns they share are the prompt.
- `kto` -> {prompt, completion, label}: prompt, completion, label (TRL's unpaired shape), or a conversation and a
  label (LLaMA-Factory's `kto_tag`), whose last assistant turn is the answer labelled.
- `sharegpt` -> {messages}: conversations of {from, value} turns (human, gpt, system mapped to chat roles).
- `alpaca` -> {messages}: instruction, input, output (the input appended to the instruction).
- `messages` -> {messages}: a conversation of {role, content} turns (ortlab's chat data as it is).
- `prompt-completion` -> {messages}: prompt and completion text (TRL's SFT shape), a two-turn conversation.

Text is read as the chat turns it stands for (a prompt is the user's turn, an answer the assistant's), so every
shape is rendered with the model's chat template and trained on the assistant's tokens only, as ortlab's chat data
is. (TRL tokenizes text pairs without the template; ortlab does not keep two ways to lay out a conversation.)

`propose_pairs_mapping` finds the shape from the column names and types, as `ortlab.data.columns` does for the
other tasks; `normalize_row` reads one row of it, or raises a `RowError` naming the column and what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ortlab.chat import ROLES, ChatDataError

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

PREFERENCE, IMPLICIT, KTO = "preference", "preference-implicit", "kto"
SHAREGPT, ALPACA, MESSAGES, PROMPT_COMPLETION = "sharegpt", "alpaca", "messages", "prompt-completion"
PAIRED_SHAPES = (PREFERENCE, IMPLICIT)  # rows of {prompt, chosen, rejected}
SFT_SHAPES = (SHAREGPT, ALPACA, MESSAGES, PROMPT_COMPLETION)  # rows of {messages}

PROMPT_NAMES = ("prompt", "instruction", "question", "query")
INPUT_NAMES = ("input",)
CHOSEN_NAMES = ("chosen",)
REJECTED_NAMES = ("rejected",)
COMPLETION_NAMES = ("completion", "response", "output", "answer")
KTO_LABEL_NAMES = ("label", "kto_tag", "desirable")
CONVERSATION_NAMES = ("conversations", "conversation", "messages", "chat", "dialog")
OUTPUT_NAMES = ("output", "response")
# ShareGPT's speakers as chat roles (LLaMA-Factory's names: human, gpt, system, observation, function_call)
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "system": "system",
    "observation": "tool",
    "tool": "tool",
}
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "desirable", "good"), ("false", "0", "no", "undesirable", "bad")


class RowError(ChatDataError):
    """One row that cannot be used: the message names the column and what is wrong (the caller adds the row)."""


@dataclass(frozen=True)
class PairsMapping:
    """The shape found in a dataset and the columns that hold each part of it (`columns`: part -> column name;
    parts: prompt, input, chosen, rejected, completion, label, conversation, instruction, output). `shape` is None
    when no shape fits; `found` says in words what was found, or why none fits."""

    shape: str | None
    columns: dict[str, str] = field(default_factory=dict)
    found: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- finding the shape ----------------------------------------------------------------------------------------


def _pick(columns: list[str], names: tuple[str, ...]) -> str | None:
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in names if n in lowered), None)


def _kind(feature: Any) -> str:
    """'text', 'turns' (a list of {role, content} or {from, value}), 'turn' (one such dict), 'bool', 'number',
    'list' (of something else) or 'other': what a column holds, from its datasets feature."""
    dtype = getattr(feature, "dtype", None)
    if dtype in ("string", "large_string"):
        return "text"
    if dtype == "bool":
        return "bool"
    if isinstance(dtype, str) and dtype.startswith(("int", "uint", "float")):
        return "number"
    if isinstance(feature, dict):
        return "turn" if _turn_keys(feature) else "other"
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    if inner is not None:
        return "turns" if isinstance(inner, dict) and _turn_keys(inner) else "list"
    return "other"


def _turn_keys(value: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (speaker, text) keys of a turn: ('role', 'content') or ShareGPT's ('from', 'value')."""
    if "role" in value and "content" in value:
        return "role", "content"
    if "from" in value and "value" in value:
        return "from", "value"
    return None


def propose_pairs_mapping(dataset: Dataset) -> PairsMapping:
    """The shape of `dataset` (see the module's table) and its columns, from the column names and features."""
    features = dataset.features
    columns = list(features)
    kinds = {c: _kind(features[c]) for c in columns}
    seen = ", ".join(f"{c} ({kinds[c]})" for c in columns) or "no columns"
    chosen, rejected = _pick(columns, CHOSEN_NAMES), _pick(columns, REJECTED_NAMES)
    prompt = _pick(columns, PROMPT_NAMES) or _pick(
        [c for c in columns if kinds[c] == "turns"], CONVERSATION_NAMES
    )  # LLaMA-Factory's ShareGPT preference data: the conversation so far, then one chosen and one rejected turn
    if chosen and rejected:
        if prompt:
            cols = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
            extra = _pick(columns, INPUT_NAMES)
            if extra and kinds[extra] == "text":
                cols["input"] = extra
            return PairsMapping(PREFERENCE, cols, _says(PREFERENCE, cols, kinds))
        if kinds[chosen] == "turns" and kinds[rejected] == "turns":
            cols = {"chosen": chosen, "rejected": rejected}
            return PairsMapping(IMPLICIT, cols, _says(IMPLICIT, cols, kinds))
        return PairsMapping(
            None,
            found=f"chosen/rejected columns ({chosen}: {kinds[chosen]}, {rejected}: {kinds[rejected]}) but no prompt "
            f"column ({' / '.join(PROMPT_NAMES)}): add one, or give chosen and rejected as whole conversations "
            "(lists of {role, content} turns) whose shared first turns are the prompt. Columns: " + seen,
        )
    label = _pick([c for c in columns if kinds[c] in ("bool", "number", "text")], KTO_LABEL_NAMES)
    conversation = _pick([c for c in columns if kinds[c] == "turns"], CONVERSATION_NAMES)
    if label:
        completion = _pick([c for c in columns if c not in (prompt, label)], COMPLETION_NAMES)
        if prompt and completion:
            cols = {"prompt": prompt, "completion": completion, "label": label}
            return PairsMapping(KTO, cols, _says(KTO, cols, kinds))
        if conversation:
            cols = {"conversation": conversation, "label": label}
            return PairsMapping(KTO, cols, _says(KTO, cols, kinds))
    if conversation:
        shape = SHAREGPT if _turn_keys_of(features[conversation]) == ("from", "value") else MESSAGES
        cols = {"conversation": conversation}
        return PairsMapping(shape, cols, _says(shape, cols, kinds))
    instruction, output = _pick(columns, ("instruction",)), _pick(columns, OUTPUT_NAMES)
    if instruction and output and kinds[instruction] == "text" and kinds[output] == "text":
        cols = {"instruction": instruction, "output": output}
        extra = _pick(columns, INPUT_NAMES)
        if extra and kinds[extra] == "text":
            cols["input"] = extra
        return PairsMapping(ALPACA, cols, _says(ALPACA, cols, kinds))
    completion = _pick([c for c in columns if c != prompt], COMPLETION_NAMES)
    if prompt and completion and kinds[prompt] == "text" and kinds[completion] == "text":
        cols = {"prompt": prompt, "completion": completion}
        return PairsMapping(PROMPT_COMPLETION, cols, _says(PROMPT_COMPLETION, cols, kinds))
    return PairsMapping(
        None,
        found="no shape of preference or instruction data fits these columns: "
        + seen
        + ". ortlab reads prompt + chosen + rejected (text or turns); chosen + rejected as whole conversations; "
        "prompt + completion + label (KTO); conversations of {from, value} turns (ShareGPT); instruction + input + "
        "output (Alpaca); messages of {role, content} turns; or prompt + completion text",
    )


def _turn_keys_of(feature: Any) -> tuple[str, str] | None:
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    return _turn_keys(inner) if isinstance(inner, dict) else None


def _says(shape: str, cols: dict[str, str], kinds: dict[str, str]) -> str:
    parts = ", ".join(f"{part} = column {name!r} ({kinds[name]})" for part, name in cols.items())
    return f"{shape} data: {parts}"


# --- one row into the internal shape -------------------------------------------------------------------------


def normalize_row(row: Mapping[str, Any], mapping: PairsMapping) -> dict[str, Any]:
    """One row of `mapping.shape` as the internal row (see the module's table), or a RowError naming the column."""
    cols, shape = mapping.columns, mapping.shape
    if shape == PREFERENCE:
        prompt = turns_of(_get(row, cols["prompt"]), cols["prompt"], "user")
        if "input" in cols:
            prompt = _with_input(prompt, _get(row, cols["input"], allow_none=True), cols)
        chosen, rejected = _two_sides(row, cols)
        _check_prompt(prompt, cols["prompt"])
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if shape == IMPLICIT:
        chosen, rejected = _two_sides(row, cols, default_role=None)
        return split_shared_prompt(chosen, rejected, cols["chosen"], cols["rejected"])
    if shape == KTO:
        label = bool_label(_get(row, cols["label"]), cols["label"])
        if "conversation" in cols:
            prompt, completion = _split_last_answer(_get(row, cols["conversation"]), cols["conversation"])
        else:
            prompt = turns_of(_get(row, cols["prompt"]), cols["prompt"], "user")
            completion = turns_of(_get(row, cols["completion"]), cols["completion"], "assistant")
            _check_answer(completion, cols["completion"])
        _check_prompt(prompt, cols.get("prompt", cols.get("conversation", "")))
        return {"prompt": prompt, "completion": completion, "label": label}
    if shape in (SHAREGPT, MESSAGES):
        messages = turns_of(_get(row, cols["conversation"]), cols["conversation"], None)
        if not any(t["role"] == "assistant" for t in messages):
            raise RowError(f"column {cols['conversation']!r}: the conversation has no assistant turn to learn from")
        return {"messages": messages}
    if shape == ALPACA:
        return {"messages": from_alpaca(row, cols)}
    if shape == PROMPT_COMPLETION:
        return {"messages": from_alpaca(row, {"instruction": cols["prompt"], "output": cols["completion"]})}
    raise RowError(f"no shape to read the row with ({mapping.found or 'none was found'})")


def _get(row: Mapping[str, Any], column: str, allow_none: bool = False) -> Any:
    if column not in row:
        raise RowError(f"column {column!r}: missing from the row")
    value = row[column]
    if value is None and not allow_none:
        raise RowError(f"column {column!r}: the value is missing (None)")
    return value


def turns_of(value: Any, column: str, default_role: str | None) -> list[dict[str, str]]:
    """A value as chat turns: text is one turn of `default_role` (None: text is not accepted), a {role, content}
    or ShareGPT {from, value} dict one turn, a list of them a conversation (ShareGPT speakers mapped to roles)."""
    if isinstance(value, str):
        if default_role is None:
            raise RowError(f"column {column!r}: a conversation (a list of turns) is needed, got text {value!r:.60}")
        return [{"role": default_role, "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RowError(f"column {column!r}: text or a non-empty list of turns is needed, got {value!r:.60}")
    turns = []
    for i, turn in enumerate(value):
        keys = _turn_keys(turn) if isinstance(turn, dict) else None
        if keys is None:
            raise RowError(
                f"column {column!r}, turn {i}: a turn is {{role, content}} or {{from, value}}, got {turn!r:.60}"
            )
        speaker, text = turn[keys[0]], turn[keys[1]]
        role = SHAREGPT_ROLES.get(speaker) if keys[0] == "from" else speaker
        if role not in ROLES:
            known = ", ".join(SHAREGPT_ROLES if keys[0] == "from" else ROLES)
            raise RowError(f"column {column!r}, turn {i}: speaker {speaker!r} is not one of {known}")
        if not isinstance(text, str):
            got = "missing (None)" if text is None else f"a {type(text).__name__}"
            raise RowError(f"column {column!r}, turn {i}: the content must be text, it is {got}")
        turns.append({"role": role, "content": text})
    return turns


def _form(value: Any) -> str:
    return "text" if isinstance(value, str) else "turns"


def _two_sides(
    row: Mapping[str, Any], cols: dict[str, str], default_role: str | None = "assistant"
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """chosen and rejected as turns, checked to be of the same form, not empty, and not equal."""
    raw_chosen, raw_rejected = _get(row, cols["chosen"]), _get(row, cols["rejected"])
    if _form(raw_chosen) != _form(raw_rejected):
        raise RowError(
            f"columns {cols['chosen']!r} and {cols['rejected']!r}: chosen is {_form(raw_chosen)} but rejected is "
            f"{_form(raw_rejected)}; give both sides in the same form (both text, or both lists of turns)"
        )
    chosen = turns_of(raw_chosen, cols["chosen"], default_role)
    rejected = turns_of(raw_rejected, cols["rejected"], default_role)
    if default_role is not None:  # explicit prompt: each side is the answer alone
        _check_answer(chosen, cols["chosen"])
        _check_answer(rejected, cols["rejected"])
        _check_differ(chosen, rejected, cols)
    return chosen, rejected


def _check_answer(turns: list[dict[str, str]], column: str) -> None:
    if any(t["role"] != "assistant" for t in turns):
        roles = ", ".join(t["role"] for t in turns)
        raise RowError(f"column {column!r}: an answer is the assistant's turns only (got {roles})")
    if not any(t["content"].strip() for t in turns):
        raise RowError(f"column {column!r}: the answer is empty")


def _check_prompt(turns: list[dict[str, str]], column: str) -> None:
    if not any(t["content"].strip() for t in turns):
        raise RowError(f"column {column!r}: the prompt is empty")


def _check_differ(chosen: list, rejected: list, cols: dict[str, str]) -> None:
    if chosen == rejected:
        raise RowError(
            f"columns {cols['chosen']!r} and {cols['rejected']!r}: chosen and rejected are the same answer, so there "
            "is no preference to learn"
        )


def split_shared_prompt(chosen: list, rejected: list, chosen_column: str, rejected_column: str) -> dict[str, Any]:
    """UltraFeedback's rows: two whole conversations that differ only in the answer. The turns they share (TRL's
    `extract_prompt`: the longest common prefix) are the prompt; what follows on each side must be the assistant's."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    # the shared turns end where an answer begins: back off over shared assistant turns at the end
    while n and chosen[n - 1]["role"] == "assistant" and (n == len(chosen) or chosen[n]["role"] == "assistant"):
        n -= 1
    cols = {"chosen": chosen_column, "rejected": rejected_column}
    prompt, answer_c, answer_r = chosen[:n], chosen[n:], rejected[n:]
    if (
        not prompt
        or not answer_c
        or not answer_r
        or answer_c[0]["role"] != "assistant"
        or answer_r[0]["role"] != "assistant"
    ):
        raise RowError(
            f"columns {chosen_column!r} and {rejected_column!r}: the two conversations do not share a prompt (the "
            f"turns before the answers differ, after {n} shared turns); each side must be the same conversation "
            "followed by its own assistant answer"
        )
    _check_answer(answer_c, chosen_column)
    _check_answer(answer_r, rejected_column)
    _check_differ(answer_c, answer_r, cols)
    return {"prompt": prompt, "chosen": answer_c, "rejected": answer_r}


def _split_last_answer(value: Any, column: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """A conversation as (everything before its last assistant turn, that turn): LLaMA-Factory's KTO rows."""
    turns = turns_of(value, column, None)
    if turns[-1]["role"] != "assistant":
        raise RowError(f"column {column!r}: the conversation must end with the assistant's answer (the one labelled)")
    prompt, answer = turns[:-1], turns[-1:]
    if not prompt:
        raise RowError(f"column {column!r}: the conversation has an answer but no prompt before it")
    _check_answer(answer, column)
    return prompt, answer


def _with_input(prompt: list[dict[str, str]], extra: Any, cols: dict[str, str]) -> list[dict[str, str]]:
    """Alpaca's `input` appended to the instruction, as Alpaca's template lays them out (instruction, a blank
    line, the input); an empty input adds nothing."""
    if extra is None or extra == "":
        return prompt
    if not isinstance(extra, str):
        raise RowError(f"column {cols['input']!r}: the input must be text, it is a {type(extra).__name__}")
    last = prompt[-1]
    if last["role"] != "user":
        raise RowError(
            f"column {cols['input']!r}: an input is appended to the user's turn, and the prompt ends with "
            f"{last['role']}"
        )
    return [*prompt[:-1], {"role": "user", "content": f"{last['content']}\n\n{extra}"}]


def from_alpaca(row: Mapping[str, Any], cols: dict[str, str]) -> list[dict[str, str]]:
    """An Alpaca row (instruction, optional input, output) as a two-turn conversation."""
    instruction, output = _get(row, cols["instruction"]), _get(row, cols["output"])
    for column, value in ((cols["instruction"], instruction), (cols["output"], output)):
        if not isinstance(value, str):
            raise RowError(f"column {column!r}: the value must be text, it is a {type(value).__name__}")
        if not value.strip():
            raise RowError(f"column {column!r}: the value is empty")
    prompt = [{"role": "user", "content": instruction}]
    if "input" in cols:
        prompt = _with_input(prompt, _get(row, cols["input"], allow_none=True), cols)
    return [*prompt, {"role": "assistant", "content": output}]


def bool_label(value: Any, column: str) -> bool:
    """KTO's label as a bool: True/False, 1/0, or the words true/false, yes/no, desirable/undesirable, good/bad."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise RowError(
        f"column {column!r}: a KTO label says whether the answer is desirable: true/false (or 1/0, yes/no), "
        f"got {value!r:.40}"
    )
