"""Token-by-token generation with an exported causal LM in ONNX Runtime: `OnnxGenerator(folder).stream(ids)`.

With a KV-cache graph (`ortlab.export.kvcache`) the prompt runs once (prefill, empty past) and every further token
is one step of one token against the cache the previous step returned; the cache stays in ONNX Runtime's own
buffers between steps (`OrtValue`s fed back as they came out, no copy through numpy). A graph without a cache
(the old export, `cache=False`) is driven too, by re-running the whole sequence per token: the benchmark compares
the two, and an old export keeps working.

Decoding is greedy (`temperature=0`, the default: the same tokens as transformers' `generate(do_sample=False)`) or
sampled with temperature and top-p (nucleus), seeded for repeatability. One sequence at a time: what a chat
playground or a local endpoint streams.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError

MODEL_FILE = "model.onnx"


class GenerationError(OrtlabError, ValueError):
    """The folder holds no causal-LM graph this loop can drive; the message says what is missing."""


def session_options(threads: int | None = None) -> Any:
    """ONNX Runtime's settings for generation on CPU: all graph optimizations (attention and layer-norm fusions,
    constant folding) and one intra-op thread per core (ORT's default, said explicitly so it is visible)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    return options


def _eos_of(folder: Path) -> list[int]:
    """The end-of-sequence ids the export saved beside the graph (generation_config.json, else config.json)."""
    for name in ("generation_config.json", "config.json"):
        file = folder / name
        if file.is_file():
            eos = json.loads(file.read_text()).get("eos_token_id")
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return []


class OnnxGenerator:
    """Generate from `folder/<file>` (an exported causal LM) with ONNX Runtime, one token at a time."""

    def __init__(self, folder: str | Path, file: str = MODEL_FILE, threads: int | None = None) -> None:
        import onnxruntime as ort

        self.folder = Path(folder)
        path = self.folder / file
        if not path.is_file():
            raise GenerationError(f"no ONNX graph at {path}: export the run first (`ortlab export RUN`)")
        self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        if "input_ids" not in inputs or "attention_mask" not in inputs:
            raise GenerationError(f"{path} is not a causal-LM graph (inputs: {', '.join(inputs)})")
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.present_names = [o.name for o in self.session.get_outputs() if o.name.startswith("present.")]
        self.has_position_ids = "position_ids" in inputs
        self.past_shapes = [inputs[n].shape for n in self.past_names]  # (batch, heads, past, head_dim)
        self.eos_token_id = _eos_of(self.folder)

    @property
    def uses_cache(self) -> bool:
        return bool(self.past_names)

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int | None = None,
    ) -> Iterator[int]:
        """Yield up to `max_new_tokens` new token ids after `prompt_ids`, stopping after an end-of-sequence id
        (`eos_token_id`, default the model's own; the EOS is yielded, as `generate` returns it).

        `temperature=0` is greedy; above 0 the next token is sampled from softmax(logits / temperature), kept to
        the smallest set of tokens whose probability reaches `top_p`."""
        import numpy as np

        if len(prompt_ids) == 0:
            raise GenerationError("an empty prompt: give at least one token (a BOS token, if nothing else)")
        if temperature < 0 or not 0 < top_p <= 1:
            raise GenerationError(f"temperature must be >= 0 and top_p in (0, 1]: got {temperature}, {top_p}")
        eos = set(self.eos_token_id if eos_token_id is None else np.atleast_1d(eos_token_id).tolist())
        rng = np.random.default_rng(seed)
        steps = self._steps_cached(prompt_ids) if self.uses_cache else self._steps_uncached(prompt_ids)
        if max_new_tokens <= 0:
            return
        logits = next(steps)
        for produced in range(1, max_new_tokens + 1):
            token = _pick(logits, temperature, top_p, rng)
            yield token
            if token in eos or produced == max_new_tokens:  # no step for a token nobody will read
                return
            logits = steps.send(token)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 64, **kwargs: Any) -> list[int]:
        """The prompt followed by what `stream` yields (the shape of `model.generate`'s output row)."""
        return [*prompt_ids, *self.stream(prompt_ids, max_new_tokens, **kwargs)]

    def _steps_cached(self, prompt_ids: Sequence[int]) -> Any:
        """A coroutine: yields the last position's logits, is sent the chosen token, yields the next logits."""
        import numpy as np
        from onnxruntime import OrtValue

        ids = np.asarray([prompt_ids], dtype=np.int64)
        total = ids.shape[1]
        past: list[Any] = []
        for shape in self.past_shapes:
            heads, head_dim = shape[1], shape[3]
            past.append(OrtValue.ortvalue_from_numpy(np.zeros((1, heads, 0, head_dim), dtype=np.float32)))
        outputs = ["logits", *self.present_names]
        while True:
            feeds = {
                "input_ids": OrtValue.ortvalue_from_numpy(ids),
                "attention_mask": OrtValue.ortvalue_from_numpy(np.ones((1, total), dtype=np.int64)),
                **dict(zip(self.past_names, past, strict=True)),
            }
            if self.has_position_ids:
                positions = np.arange(total - ids.shape[1], total, dtype=np.int64)[None]
                feeds["position_ids"] = OrtValue.ortvalue_from_numpy(positions)
            result = self.session.run_with_ort_values(outputs, feeds)
            past = [result[i] for i in range(1, len(outputs))]
            token = yield result[0].numpy()[0, -1]
            ids = np.asarray([[token]], dtype=np.int64)
            total += 1

    def _steps_uncached(self, prompt_ids: Sequence[int]) -> Any:
        """The same coroutine for a graph without a cache: the whole sequence every step."""
        import numpy as np

        ids = list(prompt_ids)
        while True:
            feeds = {"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
            if self.has_position_ids:
                feeds["position_ids"] = np.arange(len(ids), dtype=np.int64)[None]
            token = yield self.session.run(["logits"], feeds)[0][0, -1]
            ids.append(token)


def _pick(logits: Any, temperature: float, top_p: float, rng: Any) -> int:
    import numpy as np

    if temperature == 0:
        return int(logits.argmax())
    scaled = logits.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs)
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]  # the smallest set reaching top_p
        kept = np.zeros_like(probs)
        kept[keep] = probs[keep]
        probs = kept / kept.sum()
    return int(rng.choice(len(probs), p=probs))
