"""Peak memory of one training process, term by term.

    peak = runtime + weights (+ low-precision copies) + gradients + optimizer state / ZeRO shards
           + max(activations (+ logits), optimizer temporaries)

Sizes in bytes per element: weights, gradients and AdamW's two moments stay fp32 in a mixed-precision run (the
trainer keeps fp32 master weights and autocasts the matmuls; autocast caches a 16-bit copy of each matmul weight
for the forward pass). Optimizer temporaries: torch's AdamW on CPU defaults to a loop over the tensors (a temporary
the size of one tensor at a time), on CUDA to `foreach` (intermediates the size of every trainable tensor at
once), `fused` to none worth counting.

Activations (what the forward pass keeps for the backward one), per token per layer, in elements (Korthikanti et
al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4, written out for the MLP
width `i` instead of 4h): a BERT-like encoder or GPT-2 about 10.5h + 2i (their 17h at i = 4h, plus what
transformers keeps besides: masks, the residual stream's copies), a Llama-like decoder with a gated MLP 10.5h + 4i
(three MLP matrices, rotary q and k, no dropout masks), an encoder-decoder's layers 12h + 2i (cross-attention).
The constants are those counts checked against torch's own record of what the backward pass keeps
(`saved_tensors_hooks`, tests/test_estimate.py) on tiny BERT and Llama models, within 15 %.
Attention scores (seq x seq per head): on CUDA SDPA's flash and memory-efficient kernels keep none; on a CPU (and
with eager attention, which ORT's export asks for) SDPA computes them and keeps one copy per head, three with
attention dropout (scores, mask, dropped), per token per layer `copies x heads x seq`. A language model's head
adds three batch x seq x vocab fp32 tensors at the loss (logits, log-softmax, its gradient). Gradient checkpointing
keeps each layer's input (h per token per layer) and one layer's activations at a time. A per-family factor
measured on runs (`ortlab.estimator.calibration`) scales the activations once runs here have taught one.

On CPU the measured figure is the process's peak RSS, which also holds Python, torch, transformers and the data
(`runtime`, a constant measured on runs here); on CUDA it is the allocator's peak (`max_memory_allocated`), which
does not count the CUDA context (`CUDA_CONTEXT_MB`, taken off the device's memory instead).

On CPU the peak RSS also depends on the allocator the process started with (`Setup.allocator`): a run ortlab
launches gets tcmalloc where it is installed (`ortlab.accel.tcmalloc`), a run in the kernel's own process glibc's
malloc. Measured with a 5 ms RSS sampler through MiniLM's steps (2026-11-29, batch 16, length 64): under tcmalloc the
RSS rises once in the first step and stays; under glibc it climbs another ~200 MB over the next steps, whose
padded lengths differ (freed blocks of one length are kept and do not fit the next), and gradient checkpointing
saves almost none of it (peak 1299 MB against 1362 MB unchecked; under tcmalloc 1128 against 1234).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortlab.estimator.model import ModelFacts
from ortlab.estimator.terms import ASSUMED, CALIBRATED, FORMULA, MEASURED, Term, term

MB = 2**20
# Per token per layer (elements), by family: (x hidden, x intermediate).
LAYOUT = {
    "encoder": (10.5, 2),
    "decoder": (10.5, 2),
    "decoder-gated": (10.5, 4),
    "encoder-decoder": (12, 2),
}
LOGIT_COPIES = 3
# The peak RSS of a CPU training process before the model's own memory (Python, torch, transformers, datasets, the
# tokenizer, the data), and how much more than the saved activations the backward pass holds on a CPU (the
# activations' gradients, and under glibc the freed blocks it keeps), by allocator, from the MiniLM rows of
# benchmarks/bench_estimate.py without checkpointing (in-sample; the SmolLM2, T5 and checkpointed rows test them).
# 2026-11-28, glibc: peak RSS = 700 MB + model terms + 1.5 x activations. 2026-11-29, tcmalloc: 1.0 x (the RSS
# sampler's run measured 0.83 x; at 1.0 the grid's MiniLM rows are within -2 to +4 %). Under glibc a
# checkpointed run's peak keeps GLIBC_CHECKPOINT_KEEPS of what the unchecked run's activations take (see the module
# docstring; measured 0.8 on MiniLM, 0.7-0.9 on SmolLM2). A run here replaces the runtime by its own residual.
CPU_RUNTIME_MB = 700.0
CPU_BACKWARD = {"glibc": 1.5, "tcmalloc": 1.0}
GLIBC_CHECKPOINT_KEEPS = 0.8
CUDA_CONTEXT_MB = 600.0  # the CUDA context and cuBLAS workspace, outside the allocator's count (H200, torch 2.x)


@dataclass(frozen=True)
class Setup:
    """What of the spec the memory terms depend on, resolved (precision, device, optimizer variant)."""

    device: str  # "cpu" or "cuda"
    precision: str  # fp32, bf16, fp16
    batch: int
    seq: int  # the longest padded batch (peak memory follows it)
    trainable: int
    processes: int
    zero_stage: int
    optimizer: str  # "fused", "foreach" or "for-loop"
    checkpointing: bool
    eager_attention: bool
    lm_head: bool  # a language model's vocabulary-wide logits
    classes: int
    allocator: str = "glibc"  # a CPU process's malloc: "tcmalloc" or "glibc" (see the module docstring)


def optimizer_variant(device: str, fused: bool) -> str:
    """torch's AdamW implementation: fused when asked, else foreach on CUDA and the per-tensor loop on CPU (torch's
    `_default_to_fused_or_foreach`: foreach only when every parameter is on CUDA)."""
    return "fused" if fused else ("foreach" if device == "cuda" else "for-loop")


def activation_bytes(m: ModelFacts, s: Setup, scale: float = 1.0) -> tuple[float, float]:
    """(activations kept for the backward pass, the LM head's logits) in bytes, for one micro-batch."""
    per_hidden, per_inter = LAYOUT.get(m.family, LAYOUT["encoder"])
    elem = 4.0 if s.precision == "fp32" else 2.5  # autocast keeps matmul outputs in 16 bits, norms in fp32
    tokens = s.batch * s.seq
    per_token_layer = per_hidden * m.hidden + per_inter * m.intermediate
    if s.eager_attention or s.device == "cpu":  # the scores are materialised (see the module docstring)
        per_token_layer += (3 if m.attention_dropout else 1) * m.heads * s.seq
    unchecked = tokens * m.layers * per_token_layer * elem
    # checkpointing: each layer's input kept, one layer's activations live while it is recomputed
    checked = tokens * m.layers * m.hidden * elem + tokens * per_token_layer * elem
    kept = checked if s.checkpointing else unchecked
    edges = tokens * m.hidden * elem * 2  # embeddings' output and the final norm
    kept += edges
    if s.device == "cpu":
        kept *= CPU_BACKWARD[s.allocator]
        if s.checkpointing and s.allocator == "glibc":  # glibc keeps the blocks recomputation frees (docstring)
            kept = max(kept, GLIBC_CHECKPOINT_KEEPS * (unchecked + edges) * CPU_BACKWARD["glibc"])
    logits = LOGIT_COPIES * tokens * m.vocab * 4.0 if s.lm_head else 0.0
    return kept * scale, logits


def memory_terms(m: ModelFacts, s: Setup, runtime_mb: float | None, act_scale: float | None) -> list[Term]:
    """The terms of one process's peak memory (MiB). `runtime_mb`, `act_scale`: calibrations from runs here (None:
    the defaults measured on this project's machines)."""
    terms: list[Term] = []
    if s.device == "cpu":
        if runtime_mb is None:
            terms.append(term("runtime", CPU_RUNTIME_MB, 0.15, CALIBRATED, "Python, torch, transformers, data (RSS)"))
        else:
            terms.append(term("runtime", runtime_mb, 0.08, MEASURED, "from runs on this machine"))
    terms.append(term("weights", m.params * 4 / MB, 0.02, FORMULA, f"{m.params / 1e6:.1f}M parameters, fp32"))
    if s.precision in ("bf16", "fp16"):
        matmul = m.params - m.embedding_params
        terms.append(term("16-bit copies", matmul * 2 / MB, 0.3, FORMULA, "autocast's cast weights"))
    shards = s.processes if s.zero_stage >= 1 and s.processes > 1 else 1
    terms.append(term("gradients", s.trainable * 4 / MB, 0.02, FORMULA, f"{s.trainable / 1e6:.2f}M trainable"))
    opt_note = "AdamW: 2 fp32 moments" + (f", ZeRO-{s.zero_stage} shard 1/{shards}" if shards > 1 else "")
    terms.append(term("optimizer state", s.trainable * 8 / shards / MB, 0.02, FORMULA, opt_note))
    if shards > 1:
        terms.append(term("ZeRO buffers", s.trainable * 4 / MB, 0.5, ASSUMED, "DeepSpeed's flat gradient buffer"))
    if s.optimizer == "foreach":
        temp = s.trainable * 4 / shards
    elif s.optimizer == "for-loop":
        temp = min(s.trainable, m.largest_param) * 4 * 2
    else:
        temp = 0.0
    kept, logits = activation_bytes(m, s, act_scale or 1.0)
    basis = FORMULA if act_scale is None else MEASURED
    what = f"batch {s.batch} x {s.seq} tokens x {m.layers} layers" + (", checkpointed" if s.checkpointing else "")
    what += f", {s.allocator}" if s.device == "cpu" else ""
    if kept + logits >= temp:  # the optimizer step runs after the activations are freed: the larger one counts
        terms.append(term("activations", kept / MB, 0.3 if act_scale is None else 0.15, basis, what))
        if logits:
            terms.append(term("logits", logits / MB, 0.2, FORMULA, f"{LOGIT_COPIES} x batch x seq x {m.vocab:,} fp32"))
    else:
        terms.append(term("optimizer temporaries", temp / MB, 0.3, FORMULA, f"AdamW {s.optimizer}"))
    return terms
