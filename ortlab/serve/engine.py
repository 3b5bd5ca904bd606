"""One model answering chats, token by token: what `ortlab serve` and the notebook's chat playground run.

An `Engine` is a tokenizer (its chat template renders the conversation exactly as training did: the run's own saved
tokenizer, `add_generation_prompt=True`) and a backend that turns prompt ids into new ids one at a time. The backend
is the seam between "what the conversation is" and "what computes the next token":

    TorchBackend(model)        transformers' model, a manual loop over its KV cache: temperature, top-p, greedy
    OnnxBackend(generator)     `ortlab.export.OnnxGenerator` over the run's ONNX export with a KV cache (any object
                               with its `stream(ids, max_new_tokens, temperature=, top_p=, seed=)`): the same settings

Why a manual loop rather than `model.generate` with a `TextIteratorStreamer`: the loop gives token ids (the same
thing an ONNX generator gives, so both backends share the decoding, the end-of-turn test and the stop), it checks a
stop event between tokens (Stop in the playground, a client that hangs up), and it needs no second thread. Text is
decoded from all the ids so far and the new suffix sent, held back while it ends in half a UTF-8 character.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ortlab.errors import OrtlabError
from ortlab.runfolder.rundir import RunDir

# Defaults for a chat turn, and the bounds every face enforces (the endpoint's max_tokens, the playground's slider).
DEFAULT_MAX_NEW_TOKENS = 256
MAX_NEW_TOKENS = 2048


class EngineError(OrtlabError, ValueError):
    """A model that cannot chat (not a causal LM, no chat template, an unfinished run); the message says why."""


@dataclass(frozen=True)
class Settings:
    """How to pick each token. temperature 0 is greedy; top_p keeps the smallest set of tokens whose probability
    adds up to top_p; `stop` strings end the reply where they first appear (not included)."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise EngineError(f"temperature must be between 0 and 2 (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p must be above 0 and at most 1 (got {self.top_p})")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise EngineError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS} (got {self.max_new_tokens})")


class Backend(Protocol):
    """Computes new token ids after `ids`, one at a time, until `max_new_tokens` or `stop` is set."""

    name: str

    def stream(self, ids: list[int], settings: Settings, stop: threading.Event) -> Iterator[int]: ...


class TorchBackend:
    """A transformers causal LM in this process: one forward per token over its KV cache."""

    name = "pytorch"

    def __init__(self, model: Any):
        self.model = model.eval()
        # how many positions the model knows (prompt and reply together); None: it does not say
        self.context = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def stream(self, ids: list[int], settings: Settings, stop: threading.Event) -> Iterator[int]:
        import torch

        generator = None
        if settings.seed is not None:
            generator = torch.Generator().manual_seed(settings.seed)
        device = getattr(self.model, "device", "cpu")
        step = torch.tensor([ids], dtype=torch.long, device=device)
        past = None
        for _ in range(settings.max_new_tokens):
            if stop.is_set():
                return
            with torch.inference_mode():
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = pick(out.logits[0, -1], settings.temperature, settings.top_p, generator)
            yield token
            step = torch.tensor([[token]], dtype=torch.long, device=device)


class OnnxBackend:
    """An exported generator (`stream(ids, max_new_tokens, temperature=, top_p=, seed=) -> Iterator[int]`): the
    settings reach it as they reach the PyTorch loop. It ends at the model's EOS, one of the engine's end-of-turn ids
    (`end_ids`); the others and the stop strings the engine checks itself."""

    name = "onnx"

    def __init__(self, generator: Any):
        self.generator = generator

    def stream(self, ids: list[int], settings: Settings, stop: threading.Event) -> Iterator[int]:
        tokens = self.generator.stream(
            ids, settings.max_new_tokens, temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed
        )
        for token in tokens:
            if stop.is_set():
                return
            yield int(token)


def pick(logits: Any, temperature: float, top_p: float, generator: Any = None) -> int:
    """The next token from one row of logits: argmax at temperature 0, else a draw from the tempered distribution
    cut to its top-p nucleus (the most likely token always stays in)."""
    import torch

    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the tokens ahead of each one
        sorted_probs[before >= top_p] = 0.0
        return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


def end_ids(tokenizer: Any) -> set[int]:
    """The tokens that end an assistant turn: EOS and the usual end-of-turn markers the vocabulary has."""
    found = {tokenizer.eos_token_id}
    for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            found.add(tid)
    found.discard(None)
    return found


class Generation:
    """One reply being made: iterate for its text pieces; afterwards `finish_reason` ("stop": an end-of-turn token
    or a stop string; "length": max_new_tokens; "cancelled": the stop event), `prompt_tokens`, `completion_tokens`."""

    def __init__(self, engine: Engine, ids: list[int], settings: Settings, stop: threading.Event):
        self.engine, self.ids, self.settings, self.stop = engine, ids, settings, stop
        self.prompt_tokens = len(ids)
        self.completion_tokens = 0
        self.finish_reason = "length"
        self.text = ""

    def __iter__(self) -> Iterator[str]:
        tokenizer, ends, stops = self.engine.tokenizer, self.engine.end_ids, self.settings.stop
        new: list[int] = []
        sent = ""
        for token in self.engine.backend.stream(self.ids, self.settings, self.stop):
            if token in ends:
                self.finish_reason = "stop"
                break
            new.append(token)
            self.completion_tokens = len(new)
            text = tokenizer.decode(new, skip_special_tokens=True)
            cut = _first_stop(text, stops)
            if cut is not None:
                self.text, self.finish_reason = text[:cut], "stop"
                break
            if text.endswith("\ufffd"):
                continue  # half a character: wait for the rest of its bytes
            self.text = text
            shown = text[: len(text) - _held(text, stops)]  # not what may be the start of a stop string
            if len(shown) > len(sent) and shown.startswith(sent):
                piece, sent = shown[len(sent) :], shown
                yield piece
        else:  # the backend ended: max_new_tokens reached, or the stop event
            self.finish_reason = "cancelled" if self.stop.is_set() else "length"
        if len(self.text) > len(sent) and self.text.startswith(sent):
            yield self.text[len(sent) :]


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(found) if found else None


def _held(text: str, stops: tuple[str, ...]) -> int:
    """How many last characters of `text` could begin a stop string (held back until the next token says)."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


class Engine:
    """A chat model: the tokenizer that renders conversations, a backend that makes tokens, and the name it answers
    to (`model_id`, what /v1/models lists)."""

    def __init__(self, tokenizer: Any, backend: Backend, model_id: str):
        if not getattr(tokenizer, "chat_template", None):
            raise EngineError(
                f"{model_id}: the tokenizer has no chat template, so a conversation cannot be laid out as the model "
                "expects; chat with an instruction-tuned model (the embedded SmolLM2, say) or a run trained on chats"
            )
        self.tokenizer, self.backend, self.model_id = tokenizer, backend, model_id
        self.end_ids = end_ids(tokenizer)

    def describe(self) -> dict[str, Any]:
        return {"id": self.model_id, "backend": self.backend.name, "sampling": True}

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation rendered by the chat template with the assistant's turn opened, as token ids."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(
        self, messages: list[dict[str, str]], settings: Settings | None = None, stop: threading.Event | None = None
    ) -> Generation:
        """A reply to `messages` (iterate it for text pieces); setting `stop` ends it before the next token.
        EngineError when the template cannot render them, or the prompt and reply would not fit the model."""
        settings = settings or Settings()
        try:
            ids = self.prompt_ids(messages)
        except Exception as e:  # jinja's TemplateError, or the template's own raise_exception
            raise EngineError(f"the chat template cannot render these messages: {e}") from None
        context = getattr(self.backend, "context", None)
        if isinstance(context, int) and len(ids) + settings.max_new_tokens > context:
            raise EngineError(
                f"the prompt ({len(ids)} tokens) and max_tokens ({settings.max_new_tokens}) exceed the model's "
                f"{context} positions: shorten the conversation or ask for fewer tokens"
            )
        return Generation(self, ids, settings, stop or threading.Event())

    @classmethod
    def for_run(cls, run: Any, base: bool = False, onnx: str | Path | None = None) -> Engine:
        """The model a finished causal-LM run trained (LoRA: merged into its base), or with `base=True` the model it
        started from, or with `onnx` its export in that folder (ONNX with a KV cache); all with the run's own
        tokenizer, so the prompt is laid out as in training."""
        from ortlab.spec import RunSpec
        from ortlab.tasks import get_task, load_model, load_tokenizer, resolve_model

        folder = RunDir(getattr(run, "path", run))
        status = folder.status()
        adapter = (folder.model_dir / "adapter_config.json").is_file()
        if status.get("state") != "completed" or not ((folder.model_dir / "config.json").is_file() or adapter):
            raise EngineError(
                f"run {folder.id} is {status.get('state')}: only a completed run has a model to chat with"
            )
        if foreign := folder.model_not_own():
            raise EngineError(
                f"run {folder.id}: {', '.join(foreign)}. Only the run folder's own regular files are loaded: replace "
                "each link with the file itself"
            )
        spec = RunSpec.from_run(folder)
        if get_task(spec.task).feature.auto_class != "AutoModelForCausalLM":
            raise EngineError(
                f"run {folder.id} trained a {spec.task} model; chat needs a causal LM (task causal-lm or preference)"
            )
        tokenizer = load_tokenizer(str(folder.model_dir))
        if onnx is not None:
            return cls(tokenizer, OnnxBackend(onnx_generator(onnx)), f"{folder.id}:onnx")
        if base:
            model = load_model(resolve_model(spec.model.name), "causal-lm", [])
            return cls(tokenizer, TorchBackend(model), f"{folder.id}:base")
        if adapter and (folder.model_dir / "merged" / "config.json").is_file():
            model = load_model(str(folder.model_dir / "merged"), "causal-lm", [])
        elif adapter:
            from ortlab.adapters import load_merged

            model = load_merged(str(folder.model_dir), "causal-lm")
        else:
            model = load_model(str(folder.model_dir), "causal-lm", [])
        return cls(tokenizer, TorchBackend(model), folder.id)

    @classmethod
    def for_model(cls, name: str) -> Engine:
        """A model folder or a Hub id (the embedded SmolLM2's included), with its own tokenizer."""
        from ortlab.tasks import load_model, load_tokenizer, resolve_model

        path = resolve_model(name)
        return cls(load_tokenizer(path), TorchBackend(load_model(path, "causal-lm", [])), name)


def onnx_generator(folder: str | Path) -> Any:
    """`ortlab.export`'s ONNX generator with a KV cache for the export in `folder`, or EngineError when this ortlab
    has none yet (the seam is here; the generator comes with the KV-cache export)."""
    from ortlab import export

    make = getattr(export, "OnnxGenerator", None)
    if make is None:
        raise EngineError("this ortlab has no ONNX generator with a KV cache yet (ortlab.export.OnnxGenerator)")
    if not Path(folder).is_dir():
        raise EngineError(f"{folder}: no such folder; export the run first, then name its ONNX folder")
    return make(folder)
