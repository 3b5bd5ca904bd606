"""Write a llama-family causal LM to one GGUF file, as llama.cpp and Ollama read it, with the `gguf` package alone.

GGUF export is where fine-tuning tools break most (they shell out to llama.cpp's converter and `llama-quantize`,
which must be built and kept in step). The format itself is simple: key-value metadata, then named tensors. This
module writes both with `gguf.GGUFWriter`, the way llama.cpp's `convert_hf_to_gguf.py` does for `LlamaForCausalLM`:

- tensor names from gguf's own name map (`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`), a
  tied `lm_head` left out (llama.cpp and transformers both read a missing `output.weight` as tied);
- q and k projections permuted per head into llama.cpp's rotary layout (its converter's `permute`; transformers'
  GGUF loader undoes it with `_reverse_permute_weights`);
- 1-D tensors (the norms) in F32, the matrices in the asked type: F16, BF16, or Q8_0 (blocks of 32 int8 values and
  one fp16 scale, quantized by `gguf.quants`); a matrix whose rows do not split into blocks of 32 falls back to
  F16, as llama.cpp's converter does;
- the hyperparameters llama.cpp needs (`llama.*`), and the tokenizer: the byte-level BPE vocabulary (`gpt2`), its
  merges, token types (added special tokens as CONTROL), the special token ids and the chat template.

`write_gguf` writes; the check that the file answers like the trained model is `ortlab.export.ggufcheck`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ortlab.export.parity import ExportError

# quant name -> (ggml tensor type name, llama.cpp file type name): the types this writer makes
QUANTS = {"f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0")}
# llama.cpp's token types (llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def check_supported(config: Any) -> None:
    """Refuse, with the reason, a model this writer would get wrong (it knows the plain llama layout only)."""
    kind = getattr(config, "model_type", None)
    if kind != "llama":
        raise ExportError(
            f"GGUF export writes llama-architecture models (SmolLM2, Llama, TinyLlama); this model is {kind!r}. "
            "Export it to ONNX instead (`ortlab export RUN`), or convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ExportError(f"GGUF export: rope scaling {rope!r} is not written yet (only plain RoPE)")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise ExportError(f"GGUF export: {flag}=True is not written yet (llama without biases only)")


def llama_cpp_permute(weights: Any, n_head: int, n_head_kv: int | None = None) -> Any:
    """llama.cpp's rotary layout for a q/k projection (its converter's `permute`): within each head, the two
    halves HF's `rotate_half` pairs up become interleaved pairs. transformers' GGUF loader applies the inverse."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _encode(array: Any, quant: str) -> tuple[Any, Any]:
    """(data, ggml type) for one float32 tensor: 1-D stays F32; a matrix gets `quant` where its rows fit."""
    import gguf
    import numpy as np

    types = gguf.GGMLQuantizationType
    if array.ndim == 1:
        return array.astype(np.float32), types.F32
    qtype = getattr(types, QUANTS[quant][0])
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if array.shape[-1] % block:
        qtype = types.F16  # llama.cpp's converter falls back the same way
    if qtype == types.F16:
        return array.astype(np.float16), qtype
    return gguf.quants.quantize(array, qtype), qtype


def _vocab(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE tokenizer as llama.cpp's `gpt2` vocabulary stores them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = json.loads(backend.to_str()) if backend is not None else {}
    model = state.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(state.get("pre_tokenizer")):
        raise ExportError(
            "GGUF export writes byte-level BPE tokenizers (GPT-2 style: SmolLM2, Llama 3, Qwen); this tokenizer is "
            f"{model.get('type')!r} with pre-tokenizer {(state.get('pre_tokenizer') or {}).get('type')!r}"
        )
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = {t["id"]: t for t in state.get("added_tokens", [])}
    if max(by_id) >= vocab_size:
        raise ExportError(f"the tokenizer has ids up to {max(by_id)}, beyond the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:  # the model's embedding is larger than the vocabulary (padding rows)
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def _pre_tokenizer(tokenizer: Any) -> str:
    """llama.cpp's name for how text is split before BPE (`tokenizer.ggml.pre`). llama.cpp's converter finds it
    from a hash of a test tokenization; here the two splits ortlab's byte-level tokenizers use are told apart by
    their pre-tokenizer: digits one by one then GPT-2's regex (`smollm`), or GPT-2's regex alone (`gpt2`)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    text = json.dumps(state)
    return "smollm" if '"Digits"' in text and '"individual_digits": true' in text else "gpt2"


def write_gguf(model: Any, tokenizer: Any, path: Path, quant: str, name: str) -> dict[str, int]:
    """Write `model` (a transformers LlamaForCausalLM, LoRA already merged) and `tokenizer` to `path` as GGUF of
    type `quant`. Returns how many tensors went in as each ggml type (the fallbacks show there)."""
    import gguf
    import numpy as np
    import torch

    if quant not in QUANTS:
        raise ExportError(f"unknown GGUF type {quant!r}: choose one of {', '.join(QUANTS)}")
    config = model.config
    check_supported(config)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_head
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)

    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if head_dim != config.hidden_size // n_head:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(getattr(gguf.LlamaFileType, QUANTS[quant][1]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, types, merges = _vocab(tokenizer, config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for attr, add in (
        ("bos_token_id", writer.add_bos_token_id),
        ("eos_token_id", writer.add_eos_token_id),
        ("unk_token_id", writer.add_unk_token_id),
        ("pad_token_id", writer.add_pad_token_id),
    ):
        if isinstance(getattr(tokenizer, attr, None), int):
            add(getattr(tokenizer, attr))
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
        writer.add_eot_token_id(end_of_turn)
    writer.add_add_bos_token(bool(getattr(tokenizer, "add_bos_token", False)))
    if getattr(tokenizer, "chat_template", None):
        writer.add_chat_template(tokenizer.chat_template)

    counts: dict[str, int] = {}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None:
            raise ExportError(f"GGUF export: no llama.cpp name for tensor {hf_name!r}")
        array = tensor.detach().to(torch.float32).cpu().numpy()
        if base.endswith("self_attn.q_proj"):
            array = llama_cpp_permute(array, n_head, n_head)
        elif base.endswith("self_attn.k_proj"):
            array = llama_cpp_permute(array, n_head, n_kv)
        data, qtype = _encode(np.ascontiguousarray(array), quant)
        writer.add_tensor(f"{gguf_name}.{suffix}", data, raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:  # written aside, renamed when whole: a half-written file is never taken for a model
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return counts
