"""What the estimate needs to know about a model, read without loading it: config.json and the safetensors header.

A safetensors file begins with a JSON header naming every tensor with its shape and dtype (8 bytes of length, then
the header): reading it gives the exact parameter count in milliseconds, weights untouched. Without one (a
`pytorch_model.bin`, a Hub id not downloaded), the count comes from the config by the architecture's formula
(`_counted_from_config`), and says so. LoRA's trainable share is counted from the target modules' shapes in the
same header (or the config's sizes).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortlab.assets import embedded_model_path
from ortlab.errors import OrtlabError

MAX_HEADER_BYTES = 64 * 1024 * 1024  # a 1,000-layer model's header is a few MB; more is not a safetensors header
MAX_CONFIG_BYTES = 1024 * 1024
# peft's default LoRA targets by architecture (peft.utils.constants, TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
LORA_DEFAULT_TARGETS = {
    "bert": ("query", "value"),
    "roberta": ("query", "value"),
    "distilbert": ("q_lin", "v_lin"),
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",),
    "t5": ("q", "v"),
    "bart": ("q_proj", "v_proj"),
}
# Which activation layout (ortlab.estimator.memory) an architecture has: a BERT-like encoder (GELU MLP, dropout),
# a Llama-like decoder (gated MLP, RMSNorm, no dropout), GPT-2's (GELU MLP, dropout), an encoder-decoder.
FAMILIES = {
    "bert": "encoder",
    "roberta": "encoder",
    "distilbert": "encoder",
    "xlm-roberta": "encoder",
    "electra": "encoder",
    "deberta-v2": "encoder",
    "mpnet": "encoder",
    "llama": "decoder-gated",
    "mistral": "decoder-gated",
    "qwen2": "decoder-gated",
    "qwen3": "decoder-gated",
    "gemma": "decoder-gated",
    "gemma2": "decoder-gated",
    "phi3": "decoder-gated",
    "gpt2": "decoder",
    "gpt_neox": "decoder",
    "opt": "decoder",
    "t5": "encoder-decoder",
    "mt5": "encoder-decoder",
    "bart": "encoder-decoder",
    "marian": "encoder-decoder",
}


class ModelFactsError(OrtlabError, ValueError):
    """The model's config cannot be read without downloading or loading it."""


@dataclass(frozen=True)
class ModelFacts:
    """Sizes of a model, from its config and (where there is one) its safetensors header."""

    name: str
    model_type: str
    family: str  # a key of the activation layouts in ortlab.estimator.memory
    params: int  # every parameter (a tied head counted once)
    embedding_params: int  # input embeddings (a lookup: no matmul FLOPs)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    positions: int | None
    tied: bool
    attention_dropout: bool  # dropout on the attention probabilities (a CPU's SDPA then keeps more per head)
    largest_param: int  # elements of the largest tensor (the optimizer's one-at-a-time temporaries)
    counted: str  # "safetensors header" or "config formula"
    linears: dict[str, tuple[int, int]] = field(default_factory=dict)  # module leaf name -> (in, out) features

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def matmul_params(self, lm_head: bool) -> int:
        """N of the FLOP count (`ortlab.flops`): every parameter but the input embeddings, plus the LM head of a
        causal or seq2seq LM (`lm_head`) when it is the embedding matrix (a lookup on the way in, a matmul on the
        way out)."""
        head = self.vocab * self.hidden if self.tied and lm_head else 0
        return self.params - self.embedding_params + head

    def lora_trainable(self, targets: list[str] | None, rank: int, classes: int = 0) -> int:
        """LoRA's trainable parameters: rank x (in + out) per targeted linear per layer (+ a classifier head,
        which peft trains in full for a classification task)."""
        names = targets or list(LORA_DEFAULT_TARGETS.get(self.model_type, ("q_proj", "v_proj")))
        per_layer = sum(rank * (i + o) for n, (i, o) in self.linears.items() if n in names)
        if not per_layer:  # the header gave no shapes: attention projections of hidden x hidden
            per_layer = len(names) * rank * 2 * self.hidden
        return per_layer * self.layers + classes * self.hidden


def model_folder(name: str) -> Path | None:
    """A local folder for the model `name` (a folder, or ortlab's packaged copy), without building or downloading
    anything; None for a Hub id (its config is not here)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    embedded = embedded_model_path(name, build=False)
    return embedded if embedded is not None and (embedded / "config.json").is_file() else None


def _config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file() or file.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelFactsError(f"{folder} has no readable config.json")
    config = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ModelFactsError(f"{file} is not a JSON object")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _first(config: dict[str, Any], *names: str, default: int | None = None) -> int | None:
    for n in names:
        v = config.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def safetensors_shapes(folder: Path) -> dict[str, list[int]] | None:
    """{tensor name: shape} from the folder's safetensors headers (every shard), or None without any."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_HEADER_BYTES:
                raise ModelFactsError(f"{file}: a safetensors header of {size:,} bytes is not one")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict) and isinstance(info.get("shape"), list):
                shapes[name] = [int(d) for d in info["shape"]]
    return shapes


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_model(name: str) -> ModelFacts:
    """The facts of the model `name` (a local folder or a packaged Hub id); ModelFactsError when its config is not
    on this machine (a Hub id: nothing is downloaded to estimate)."""
    folder = model_folder(name)
    if folder is None:
        raise ModelFactsError(
            f"{name!r} is not a local model folder (nor one ortlab ships): its config.json is not here, and "
            "nothing is downloaded to estimate"
        )
    c = _config(folder)
    model_type = str(c.get("model_type", "unknown"))
    hidden = _first(c, "hidden_size", "n_embd", "d_model", default=0) or 0
    layers = _first(c, "num_hidden_layers", "n_layer", "num_layers", default=0) or 0
    if c.get("is_encoder_decoder"):
        layers += _first(c, "num_decoder_layers", "decoder_layers", default=layers) or 0
    if not hidden or not layers:
        raise ModelFactsError(f"the config of {name!r} names no hidden size or layer count")
    heads = _first(c, "num_attention_heads", "n_head", "num_heads", default=max(1, hidden // 64)) or 1
    kv_heads = _first(c, "num_key_value_heads", default=heads) or heads
    intermediate = _first(c, "intermediate_size", "n_inner", "d_ff", "ffn_dim", default=4 * hidden) or 4 * hidden
    vocab = _first(c, "vocab_size", default=0) or 0
    positions = _first(c, "max_position_embeddings", "n_positions", "max_seq_len")
    tied = bool(c.get("tie_word_embeddings", model_type not in ("llama", "mistral", "qwen2")))
    shapes = safetensors_shapes(folder)
    linears: dict[str, tuple[int, int]] = {}
    if shapes:
        counted = "safetensors header"
        params = sum(_numel(s) for s in shapes.values())
        embedding = sum(_numel(s) for n, s in shapes.items() if _is_embedding(n))
        largest = max(_numel(s) for s in shapes.values())
        for n, s in shapes.items():
            parts = n.split(".")
            if len(s) == 2 and parts[-1] == "weight" and len(parts) >= 2:
                linears.setdefault(parts[-2], (s[1], s[0]))
        tied = tied and not any(n.startswith("lm_head") for n in shapes)
    else:
        counted = "config formula"
        params, embedding, largest = _counted_from_config(c, hidden, layers, intermediate, heads, kv_heads, vocab)
    return ModelFacts(
        name=name,
        model_type=model_type,
        family=FAMILIES.get(model_type, "decoder-gated" if "CausalLM" in str(c.get("architectures")) else "encoder"),
        params=params,
        embedding_params=embedding,
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        vocab=vocab,
        positions=positions,
        tied=tied,
        attention_dropout=any(
            isinstance(c.get(k), (int, float)) and c[k] > 0
            for k in ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop", "dropout_rate")
        ),
        largest_param=largest,
        counted=counted,
        linears=linears,
    )


def _counted_from_config(
    c: dict[str, Any], hidden: int, layers: int, inter: int, heads: int, kv_heads: int, vocab: int
) -> tuple[int, int, int]:
    """(params, embedding params, largest tensor) by the transformer's formula: attention (q, o full; k, v by the
    key/value heads), the MLP (three matrices when gated), norms; embeddings (and positions) once."""
    kv = hidden * kv_heads // heads
    gated = FAMILIES.get(str(c.get("model_type"))) == "decoder-gated"
    attention = 2 * hidden * hidden + 2 * hidden * kv + 4 * hidden
    mlp = (3 if gated else 2) * hidden * inter + inter + hidden
    per_layer = attention + mlp + 4 * hidden
    positions = (_first(c, "max_position_embeddings", "n_positions", default=0) or 0) if not gated else 0
    embedding = (vocab + positions) * hidden
    head = 0 if c.get("tie_word_embeddings", not gated) else vocab * hidden
    return per_layer * layers + embedding + head, embedding, max(vocab * hidden, hidden * inter)


def _is_embedding(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] == "weight" and len(parts) >= 2 and ("embed" in parts[-2] or parts[-2] in ("wte", "wpe", "shared"))
