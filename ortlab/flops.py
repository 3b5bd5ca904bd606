"""Model FLOPs per sample and the device's peak FLOP/s: the two halves of MFU (model FLOPs utilisation).

MFU = (model FLOPs per second achieved) / (the device's dense peak FLOP/s for the precision the matmuls ran in).
ortlab holds every run against the peak measured on its own machine (`ortlab.peak`: a CPU has no datasheet peak,
and a GPU's measured one says what this driver and torch give); on a GPU of the table below the datasheet's peak is
reported beside it (`mfu_datasheet`), the figure published MFU numbers use.
It answers "how close to the hardware's limit is this run?", which samples/s alone cannot: 5,000 samples/s is
excellent for bert-base on one GPU and poor for a 10x smaller model.

The count (PaLM's convention, Chowdhery et al. 2022, appendix B; chosen because it is the one published MFU
figures use, so ours compare with theirs):

    per sample = 2*N*s (forward) + 2*N*s (backward, input gradients) + 2*N_trainable*s (weight gradients)
                 + 12 * layers * hidden * s**2 (attention scores and values, forward + backward)

with s the padded sequence length the GPU really computes on, and N the parameters that take part in matmuls:
every parameter except the input embeddings (a lookup, no multiply-adds) but including a tied output head (the
LM head multiplies by the embedding matrix, hidden*vocab per token). Full fine-tuning gives the familiar
6*N*s; with frozen weights (LoRA) their weight gradients are not computed, so counting them would overstate MFU.
Norms, activations, softmax and the optimizer are left out (a few percent; they are not "model FLOPs").
Recomputation (activation checkpointing) is not counted either: MFU counts the model's work, not the hardware's.

This module imports no torch at module level; `count_parameters` takes a model that is already loaded.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

METHOD = (
    "PaLM: 2N fwd + 2N input grads + 2N_trainable weight grads per token, N = matmul parameters (input embeddings "
    "excluded, a tied LM head included), + 12*layers*hidden*seq^2 attention per sample; padded length"
)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs to know about a model (counted once, at the start of training)."""

    matmul_params: int  # N: parameters used in matmuls (no input embeddings; a tied output head counted)
    trainable_matmul_params: int  # those of N that receive weight gradients
    layers: int
    hidden: int
    embedding_params: int  # left out of N (reported, so the choice is visible)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_parameters(model: Any) -> ModelShape | None:
    """Count `model`'s parameters for the FLOP formula; None if its config has no layer count/hidden size."""
    import torch

    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    layers = _first_attr(text, ("num_hidden_layers", "n_layer", "num_layers"))
    hidden = _first_attr(text, ("hidden_size", "n_embd", "d_model"))
    if not layers or not hidden:
        return None
    embedding_weights: set[int] = set()
    embedding_params = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            for p in module.parameters(recurse=False):
                if id(p) not in embedding_weights:
                    embedding_weights.add(id(p))
                    embedding_params += p.numel()
    total = trainable = 0
    for p in model.parameters():  # unique parameters: a tied weight appears once
        if id(p) in embedding_weights:
            continue
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None and id(weight) in embedding_weights:
        # Tied LM head: a lookup on the way in, a real (hidden x vocab) matmul on the way out.
        total += weight.numel()
        trainable += weight.numel() if weight.requires_grad else 0
    return ModelShape(total, trainable, int(layers), int(hidden), embedding_params)


def flops_per_sample(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs (forward + backward) of one sample of `seq_len` tokens (see the module docstring)."""
    per_token = 4 * shape.matmul_params + 2 * shape.trainable_matmul_params
    return float(per_token * seq_len + 12 * shape.layers * shape.hidden * seq_len**2)


def _first_attr(obj: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


# --- peak FLOP/s ------------------------------------------------------------------------------------------
# Dense (no 2:4 sparsity) peak TFLOP/s from NVIDIA's datasheets, per precision of the matmul inputs. fp16/bf16 are
# with fp32 accumulation (what autocast uses; GeForce cards run fp16-accumulate at twice that, which training does
# not use). tf32 is the fp32 run with TF32 matmuls on. None: the GPU has no tensor-core path for that precision.
# Keys are regular expressions over `torch.cuda.get_device_name()`, tried in order (first match wins).
PEAK_TFLOPS: tuple[tuple[str, str, dict[str, float | None]], ...] = (
    (r"H100.*NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100.*PCIe", "H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    (r"H100", "H100 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"H200.*NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1, "fp16": 362.1}),
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA10\b", "A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"RTX 4090", "GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    (r"\bT4\b", "T4", {"fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0}),
    (r"V100", "V100", {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0}),
)


@dataclass(frozen=True)
class Peak:
    """The peak a run's MFU is measured against, or why there is none (`flops` None, `reason` says why)."""

    device_name: str
    precision: str
    flops: float | None
    gpu: str | None = None  # the table's name for the GPU that matched
    reason: str = ""
    source: str = "datasheet"  # "datasheet" (PEAK_TFLOPS) or "measured" (ortlab.peak, on this machine)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def matmul_precision(precision: str, tf32: bool) -> str:
    """The precision the matmuls run in: bf16/fp16 as configured; fp32 runs in tf32 when TF32 matmuls are on."""
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if tf32 else "fp32"


def measured(device_name: str, precision: str, flops: float, size: int, threads: int, cached: bool) -> Peak:
    """The peak a run is held against, measured on its machine (`ortlab.peak`), described for the record."""
    where = f"{threads} threads" if device_name == "cpu" else device_name
    when = "cached measurement" if cached else "measured at the run's start"
    return Peak(
        device_name,
        precision,
        flops,
        reason=f"measured here: {size}x{size} {precision} matmuls on {where}, {flops / 1e12:.2f} TFLOP/s ({when})",
        source="measured",
    )


def peak_flops(device_name: str, precision: str, device_type: str = "cuda") -> Peak:
    """Datasheet dense peak FLOP/s of `device_name` for `precision` (fp32, tf32, bf16, fp16); a CPU or an unknown
    GPU gets none (`ortlab.peak` measures one instead)."""
    if device_type != "cuda":
        return Peak(
            device_name,
            precision,
            None,
            reason=f"no datasheet peak on {device_type}: CPUs publish no dense peak per precision (it depends on "
            "cores, clocks and vector units); the measured one applies",
        )
    for pattern, gpu, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            value = peaks.get(precision)
            if value is None:
                return Peak(device_name, precision, None, gpu, f"the {gpu} has no {precision} tensor-core peak")
            return Peak(device_name, precision, value * 1e12, gpu, f"{gpu} dense {precision} datasheet peak")
    return Peak(
        device_name,
        precision,
        None,
        reason=f"{device_name!r} is not in ortlab's table of GPU peaks (ortlab.flops.PEAK_TFLOPS): no MFU rather "
        "than a guessed peak",
    )
