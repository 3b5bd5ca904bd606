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
