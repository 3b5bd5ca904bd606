"""The export of a causal LM *with* its KV cache: one graph whose inputs are the new tokens and the cache so far
(`past_key_values.<layer>.key/value`), and whose outputs are the logits and the cache grown by the new tokens
(`present.<layer>.key/value`). Generation then costs one short step per token instead of a pass over the whole
prefix (the old one-graph export, still what `cache=False` writes).

One graph serves both phases: the prompt (prefill: past length 0, the prompt's tokens in) and each decoding step
(one token in, the cache of everything before it). ONNX accepts a dimension of size 0, so an empty past is an
ordinary input, and the graph is traced with a past of a few positions and a sequence of two tokens so that the
tracer sees neither 0 nor 1 and keeps both axes symbolic (`docs/decisions/export-kv-cache.md`).

transformers 5 keeps the cache as a `DynamicCache` object, which an ONNX graph cannot carry: `KVWrapper` takes the
flat tensors, builds the cache object the model expects, and returns the flat tensors of the cache it grew.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The names the graph's inputs and outputs carry (the same as Optimum's, so tools that know those find them).
PAST = "past_key_values.{layer}.{kind}"
PRESENT = "present.{layer}.{kind}"


def cache_shape(config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a decoder's cache."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers, heads, head_dim


def cache_names(layers: int, template: str) -> list[str]:
    return [template.format(layer=i, kind=kind) for i in range(layers) for kind in ("key", "value")]


def kv_wrapper(model: Any) -> Any:
    """`model` as the KV export sees it: (input_ids, attention_mask, position_ids, *flat past) -> (logits, *flat
    present). The attention mask covers past and new tokens (batch, past + sequence), as in `generate`."""
    import torch
    from transformers import DynamicCache

    layers, _, _ = cache_shape(model.config)

    class KVWrapper(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, *past):
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            cache = DynamicCache(pairs, config=self.inner.config)
            out = self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return KVWrapper(model).eval()


def export_kv(model: Any, path: Path, opset: int = 17) -> None:
    """Write `model` (a causal LM, eval mode, eager attention) with past key values in and out to `path`."""
    import torch

    layers, heads, head_dim = cache_shape(model.config)
    wrapper = kv_wrapper(model)
    batch, past, seq = 2, 3, 2  # neither 0 nor 1: the tracer would fold a size it sees as 0 or 1 into a constant
    dtype = next(model.parameters()).dtype
    input_ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    attention_mask = torch.ones(batch, past + seq, dtype=torch.int64)
    position_ids = torch.arange(past, past + seq).expand(batch, seq)
    flat = [torch.randn(batch, heads, past, head_dim, dtype=dtype) for _ in range(2 * layers)]
    past_names, present_names = cache_names(layers, PAST), cache_names(layers, PRESENT)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes.update({name: {0: "batch", 2: "past_sequence"} for name in past_names})
    axes.update({name: {0: "batch", 2: "total_sequence"} for name in present_names})
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (input_ids, attention_mask, position_ids, *flat),
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )


def greedy_config(model: Any, max_new_tokens: int) -> Any:
    """Plain greedy decoding with the model's own end tokens and nothing else: a saved generation config can ask
    for a repetition penalty or other processors that change which token wins; the check compares graphs."""
    from transformers import GenerationConfig

    own, config = model.generation_config, model.config
    eos = own.eos_token_id if own.eos_token_id is not None else config.eos_token_id
    pad = own.pad_token_id if own.pad_token_id is not None else config.pad_token_id
    if pad is None:
        pad = (eos[0] if isinstance(eos, list) else eos) or 0
    return GenerationConfig(
        eos_token_id=eos, pad_token_id=pad, max_new_tokens=max_new_tokens, num_beams=1, do_sample=False
    )


def held_out_prompts(inputs: dict[str, Any], n: int, length: int) -> list[list[int]]:
    """Prompts from the run's own eval rows: the first `length` real (unpadded) tokens of the first `n` rows."""
    prompts = []
    for ids, mask in zip(inputs["input_ids"][:n], inputs["attention_mask"][:n], strict=True):
        tokens = ids[mask.bool()].tolist()[:length]
        if tokens:
            prompts.append(tokens)
    return prompts


def generation_parity(
    model: Any, folder: Path, files: dict[str, str], prompts: list[list[int]], max_new_tokens: int
) -> tuple[float, dict[str, tuple[float, float]]]:
    """Greedy generations of each ONNX file in `folder` against PyTorch's `generate` on `prompts`, one prompt at a
    time (what a chat or an endpoint does). Returns PyTorch's milliseconds per generated token and, per file, the
    share of prompts whose tokens equal PyTorch's (token for token, EOS included) and its milliseconds per token.
    A first, untimed prompt warms both sides up (allocations, kernel choice)."""
    import time

    import torch

    from ortlab.export.kvgen import OnnxGenerator

    config = greedy_config(model, max_new_tokens)
    eos = config.eos_token_id

    def pytorch(ids: list[int]) -> list[int]:
        with torch.no_grad():
            row = torch.tensor([ids])
            out = model.generate(input_ids=row, attention_mask=torch.ones_like(row), generation_config=config)
        return out[0].tolist()

    def timed(fn: Any) -> tuple[list[list[int]], float]:
        fn(prompts[0])  # warm-up
        outputs, tokens, started = [], 0, time.perf_counter()
        for ids in prompts:
            outputs.append(fn(ids))
            tokens += len(outputs[-1]) - len(ids)
        return outputs, (time.perf_counter() - started) * 1000 / max(tokens, 1)

    expected, pytorch_ms = timed(pytorch)
    results = {}
    for name, file in files.items():
        generator = OnnxGenerator(folder, file)
        got, ms = timed(
            lambda ids, g=generator: g.generate(ids, max_new_tokens, eos_token_id=[] if eos is None else eos)
        )
        same = sum(a == b for a, b in zip(got, expected, strict=True)) / len(prompts)
        results[name] = (same, ms)
    return pytorch_ms, results
