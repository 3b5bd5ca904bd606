"""Time per step and for the whole run: FLOPs over the device's peak times an efficiency, plus what is not matmul.

    step  = FLOPs of the step / (peak FLOP/s x efficiency) + the optimizer's pass over its state
    run   = startup + steps x step + evaluations (before and after training)

FLOPs per sample are `ortlab.flops.flops_per_sample` (PaLM's count: 6N per token for full training, 4N + 2N_trainable
with frozen weights, plus the attention's 12 x layers x hidden x seq^2), at the mean padded length of a batch
(`ortlab.estimator.lengths`); gradient checkpointing adds one more forward (2N per token). The peak is the matmul
peak measured on this machine (`ortlab.peak`, read from its cache: nothing is measured here), or the datasheet's for
a GPU on paper (`ortlab.estimator.gpus`). The efficiency (model FLOP/s achieved over peak: MFU) is the one part that
cannot be derived: small matrices, Python and the framework's overheads set it. It defaults to a value measured on
this project's machines per model family and device (EFFICIENCY), and is replaced by the median of the runs on this
machine once there are some (`ortlab.estimator.calibration`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

from ortlab.cpuinfo import cpu_facts
from ortlab.envvars import cache_dir
from ortlab.estimator.terms import ASSUMED, CALIBRATED, FORMULA, MEASURED, Term, term
from ortlab.flops import ModelShape, flops_per_sample

# Default efficiency (MFU) by (device, family) before any run here: CPU values from benchmarks/bench_estimate.py on
# this project's 2-core EPYC, quiet, against its fp32 peak measured quiet (163 GFLOP/s), each row in a fresh process
# with tcmalloc, as a launched run has it (2026-11-29, in-sample: the medians of the rows' own efficiencies):
# MiniLM 0.74-0.94 (0.85), SmolLM2 0.68-0.82 (0.75). Under glibc (a run in a kernel's own process) steps here were
# up to 1.1x slower (bench_allocator: 1.07-1.16x); that is not modelled. GPT-2-style decoders were not measured
# (0.65, below the gated ones). The tiny T5 reached 0.05 (its steps are overhead): 0.25 kept for real
# encoder-decoders, unmeasured. (2026-11-28, glibc, forked rows: 0.75 and 0.6.) GPU values: the usual range of
# small-model fine-tuning in bf16 (0.2-0.5), assumed until a GPU run here calibrates them.
EFFICIENCY = {
    ("cpu", "encoder"): 0.85,
    ("cpu", "decoder-gated"): 0.75,
    ("cpu", "decoder"): 0.65,
    ("cpu", "encoder-decoder"): 0.25,
}
GPU_EFFICIENCY = 0.35
CPU_PEAK_DEFAULT = 50e9  # FLOP/s when no peak was ever measured here (`ortlab doctor` measures it)
# Bytes/s AdamW streams its state at on a CPU, by torch's implementation (`memory.optimizer_variant`), measured on this
# project's 2-core EPYC (torch 2.6, 2 threads, best of 5 steps at ADAMW_BYTES per parameter): fused 38-40 GB/s,
# the per-tensor loop 3.6-4.5 GB/s, over 22.7M and 135M parameters. The loop is nearly ten times slower: a step of a
# full 135M-parameter fine-tune spends 0.85 s in it against 0.10 s fused. (The one assumed 5 GB/s it replaces
# made every fused run's optimizer term 8x too long: the estimate grid's calibrated step-time error fell from 32 %
# to 5 % median with it.)
CPU_BANDWIDTH = {"fused": 38e9, "foreach": 4.5e9, "for-loop": 4.5e9}
# Bytes/s of gloo's collectives between two processes of one machine, over the tensor's size (torchrun, 22.7M fp32,
# best of 5; this project's 2-core EPYC, 2026-11-29): all-reduce 1.04 GB/s, all-gather 0.47 GB/s. (The 5 GB/s assumed
# before made the 2-process ZeRO-1 row of the estimate grid 27 % short.) A ring moves 2(n-1)/n of the tensor per
# process: scaled from n = 2 by that.
CPU_ALLREDUCE_BANDWIDTH = 1.04e9
CPU_ALLGATHER_BANDWIDTH = 0.47e9
GPU_BANDWIDTH = 1.5e12
ADAMW_BYTES = 28  # per trainable parameter and step: read weight, grad, 2 moments (16), write weight, 2 moments (12)
# A step's cost that no FLOP count sees: the trainer's Python, the collator, kernel launches (a GPU runs a small
# model's kernels faster than Python issues them), per step and per layer of every micro-batch.
# - CPU: the tiny T5's step (4 layers, a tenth of it matmuls) took 13 ms in a forked process under glibc and 14-16 ms
#   in a fresh one with tcmalloc (2026-11-29): 5 ms + 2 ms a layer (1 ms a layer predicted 10 ms; 20 ms + 2 ms a
#   layer had been assumed first).
# - CUDA: the one GPU measurement, an H200 (torch 2.11, 2026-11-28,
#   benchmarks/results/gpu-session-2026-11-28-h200.json): SmolLM2-135M's 30 layers, batch 16 of short chat rows,
#   steady steps of 0.29 s (LoRA) and 0.32 s (full) at 0.4-0.5 % MFU, so all but ~5 ms of it overhead; 1.5 ms a
#   layer had predicted 0.06 s. Now 9.5 ms a layer: fitted on that one run (in-sample, one model, one host CPU).
STEP_OVERHEAD_S = {"cpu": 0.005, "cuda": 0.01}
STEP_OVERHEAD_PER_LAYER_S = {"cpu": 0.002, "cuda": 0.0095}
STARTUP_S = {"cpu": 25.0, "cuda": 40.0}  # imports, model and data loading before the first step (assumed)


def cpu_peak(precision: str) -> tuple[float, str, str]:
    """(FLOP/s, basis, note) of this CPU's matmul peak in `precision`, from `ortlab.peak`'s cache (no torch
    import: the cache's fingerprint is matched on what can be read without it)."""
    facts = cpu_facts()
    try:
        version = importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    threads = facts.get("cores") or os.cpu_count()
    best: tuple[float, int] | None = None
    folder = cache_dir() / "peak"
    for file in sorted(folder.glob("*.json"))[:64] if folder.is_dir() else []:
        try:
            if file.stat().st_size > 64 * 1024:
                continue
            data = json.loads(Path(file).read_text(encoding="utf-8"))
            fp, peak = data["fingerprint"], data["peak"]
            if fp.get("cpu") != facts or fp.get("python") != platform.python_version() or fp.get("device") != "cpu":
                continue
            if str(fp.get("torch", "")).split("+")[0] != version or peak.get("precision") != precision:
                continue
            flops = float(peak["flops"])
            rank = (int(fp.get("threads") == threads), flops)
            if flops > 0 and (best is None or rank > (int(best[1] == threads), best[0])):
                best = (flops, int(fp.get("threads") or 0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    if best is None:
        return CPU_PEAK_DEFAULT, ASSUMED, "no measured peak here yet: `ortlab doctor` measures it"
    return best[0], MEASURED, f"{precision} matmul peak, {best[1]} threads ({best[0] / 1e9:.0f} GFLOP/s)"


def step_terms(
    shape: ModelShape,
    seq_mean: float,
    micro_batches: int,
    batch: int,
    trainable: int,
    checkpointing: bool,
    peak: float,
    efficiency: float,
    efficiency_basis: str,
    device: str,
    processes: int,
    optimizer: str = "fused",
    zero_stage: int = 0,
) -> tuple[list[Term], float]:
    """(the terms of one optimizer step in seconds, its model FLOPs for the MFU)."""
    per_sample = flops_per_sample(shape, round(seq_mean))
    model_flops = per_sample * batch * micro_batches
    recompute = 2 * shape.matmul_params * seq_mean * batch * micro_batches if checkpointing else 0.0
    compute = (model_flops + recompute) / (peak * efficiency)
    spread = {MEASURED: 0.15, CALIBRATED: 0.3, ASSUMED: 0.5}.get(efficiency_basis, 0.3)
    terms = [
        term(
            "compute",
            compute,
            spread,
            efficiency_basis,
            f"{(model_flops + recompute) / 1e9:,.0f} GFLOP at {efficiency:.0%} of {peak / 1e9:,.0f} GFLOP/s",
        )
    ]
    bandwidth = GPU_BANDWIDTH if device == "cuda" else CPU_BANDWIDTH[optimizer]
    basis, spread = (ASSUMED, 0.5) if device == "cuda" else (MEASURED, 0.3)  # (CPU: measured here, per variant)
    note = f"AdamW ({optimizer}) over its state at {bandwidth / 1e9:.0f} GB/s"
    terms.append(term("optimizer", trainable * ADAMW_BYTES / bandwidth, spread, basis, note))
    per_step = STEP_OVERHEAD_S[device] + STEP_OVERHEAD_PER_LAYER_S[device] * shape.layers * micro_batches
    terms.append(term("framework", per_step, 0.5, ASSUMED, "Python, kernel launches, collation"))
    if processes > 1 and device == "cuda":
        terms.append(term("gradient all-reduce", trainable * 4 * 2 / GPU_BANDWIDTH, 0.7, ASSUMED, "ring all-reduce"))
    elif processes > 1:
        ring = (processes - 1) / processes / 0.5  # relative to the 2 processes it was measured on
        note = f"gloo, {processes} processes here, at {CPU_ALLREDUCE_BANDWIDTH / 1e9:.2f} GB/s"
        terms.append(term("gradient all-reduce", trainable * 4 * ring / CPU_ALLREDUCE_BANDWIDTH, 0.3, MEASURED, note))
        if zero_stage >= 1:  # each process updates its shard, then every process gathers the others' parameters
            note = f"ZeRO-{zero_stage}: gloo all-gather at {CPU_ALLGATHER_BANDWIDTH / 1e9:.2f} GB/s"
            gather = trainable * 4 * ring / CPU_ALLGATHER_BANDWIDTH
            terms.append(term("parameter all-gather", gather, 0.3, MEASURED, note))
    return terms, model_flops


def eval_seconds(shape: ModelShape, seq_mean: float, rows: int, peak: float, efficiency: float) -> float:
    """One evaluation over `rows` rows: a forward pass (2N per token)."""
    return rows * 2 * shape.matmul_params * seq_mean / (peak * efficiency)


def startup_term(device: str, calibrated: float | None) -> Term:
    if calibrated is not None:
        return term("startup", calibrated, 0.2, MEASURED, "imports, model and data loading (runs here)")
    return term("startup", STARTUP_S[device], 0.5, ASSUMED, "imports, model and data loading")


__all__ = ["FORMULA", "cpu_peak", "eval_seconds", "startup_term", "step_terms"]
