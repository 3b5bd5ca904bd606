"""An Ollama `Modelfile` for an exported GGUF: `ollama create NAME -f Modelfile` then `ollama run NAME`.

Ollama does not run the Jinja chat template that a GGUF carries; it runs its own Go template (TEMPLATE), so the
Modelfile has to say the same thing in Go's syntax. ortlab writes it for ChatML (SmolLM2, Qwen and the tiny models
ortlab trains), the one template it can check: the Jinja template is rendered for a sample conversation and must
give exactly the ChatML text, else no Modelfile is written (and the report says why), rather than a wrong one.

How the Go template gets its input (Ollama's server, read in its source): every message of the conversation,
system turns included, is in `.Messages` with `.Role` and `.Content`; the Modelfile's SYSTEM is put first as a system
message when the conversation has none, which is what SmolLM2's Jinja template does with its default system
prompt. So one `range` over the messages, then the generation prompt, is the whole template.

Grammar (Ollama's docs and parser): one instruction per line (FROM, PARAMETER, TEMPLATE, SYSTEM, ADAPTER, LICENSE,
MESSAGE), `#` comments, values plain, "quoted" or \"\"\"triple-quoted\"\"\" (several lines, no escapes: a value
holding \"\"\" cannot be written, and is refused here).
"""

from __future__ import annotations

from typing import Any

CHATML_GO = "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
_SAMPLE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "U2"},
]


def chatml(messages: list[dict[str, str]], generation_prompt: bool = True) -> str:
    """ChatML text of a conversation, as CHATML_GO renders it (and as the tests render the Go template)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def default_system(tokenizer: Any) -> str | None:
    """The system prompt the Jinja template adds when a conversation has none (SmolLM2's "You are a helpful AI
    assistant named SmolLM ..."), or None."""
    one = [{"role": "user", "content": "U"}]
    text = tokenizer.apply_chat_template(one, tokenize=False, add_generation_prompt=True)
    head = "<|im_start|>system\n"
    if not text.startswith(head):
        return None
    return text[len(head) : text.index("<|im_end|>\n")]


def is_chatml(tokenizer: Any) -> str | None:
    """None if the tokenizer's chat template renders ChatML exactly (with and without a system turn), else why not."""
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template"
    try:
        given = tokenizer.apply_chat_template(_SAMPLE, tokenize=False, add_generation_prompt=True)
        system = default_system(tokenizer)
        bare = tokenizer.apply_chat_template(_SAMPLE[1:], tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template that fails on a plain conversation is not one to translate
        return f"its chat template fails on a plain conversation: {e}"
    expected_bare = chatml(([{"role": "system", "content": system}] if system is not None else []) + _SAMPLE[1:])
    if given != chatml(_SAMPLE) or bare != expected_bare:
        return "its chat template is not ChatML (<|im_start|>role ... <|im_end|>): write the TEMPLATE by hand"
    return None


def _quoted(value: str, what: str) -> str:
    if '"""' in value:
        raise ValueError(f'the {what} holds """, which a Modelfile cannot quote')
    return f'"""{value}"""'


def modelfile(gguf_name: str, tokenizer: Any, context_length: int, generation: dict[str, float]) -> str:
    """The Modelfile text for `gguf_name` (beside it). `generation`: PARAMETER values (temperature, top_p ...)."""
    stops = ["<|im_end|>", "<|im_start|>"]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos not in stops and " " not in eos and '"' not in eos:
        stops.append(eos)
    lines = [
        "# Ollama Modelfile written by ortlab: ollama create NAME -f Modelfile && ollama run NAME",
        f"FROM ./{gguf_name}",
        f"TEMPLATE {_quoted(CHATML_GO, 'template')}",
    ]
    system = default_system(tokenizer)
    if system:
        lines.append(f"SYSTEM {_quoted(system, 'default system prompt')}")
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines.append(f"PARAMETER num_ctx {min(int(context_length), 4096)}")
    lines += [f"PARAMETER {k} {v:g}" for k, v in generation.items()]
    return "\n".join(lines) + "\n"
