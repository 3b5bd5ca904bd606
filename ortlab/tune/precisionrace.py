"""The precision probe: does bf16 (or fp16) train this model faster than fp32 *here*, and does it compute the same
loss? A few seconds, on the run's own model and batches, for a run of any length.

Whether bf16 wins depends on the machine (1.6x faster on a Xeon with AVX512_BF16/AMX, 10x slower on a CPU without
them, 0.7x on another measured one) and on the model's shapes (a tiny model spends its step casting, not
multiplying). The full tuner (`ortlab.tune.measure`) answers that in a minute of separate processes, which only
long runs can pay for; so a run whose precision is 'auto' asks this probe instead:

- forward and backward of the run's own model on the run's own batches (the optimizer's step is the same in both
  precisions: its master weights stay fp32), fp32 and the 16-bit candidate interleaved batch by batch, in an order
  that alternates, so a busy machine slows both alike;
- the candidate wins only when it is faster in the median of the paired ratios by more than WIN_MARGIN and in so
  many rounds that chance explains it rarely (the tuner's sign test); the default must never lose;
- on the same batch, the candidate's loss must stay within the tuner's tolerance of fp32's (LOSS_RTOL/LOSS_ATOL),
  or it is rejected: an acceleration that changes what is learned is not an acceleration;
- nothing of the run changes: gradients are dropped and the random state is put back, so the run that follows
  trains exactly as it would have without the probe.

The verdict is cached per (machine, libraries, model, batch shapes) beside the tuner's measurements, so it is
paid once. A CPU without hardware bf16 is not probed at all (the doctor knows it is 10x slower): fp32, free.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ortlab import safeio
from ortlab.tune.judge import LOSS_ATOL, LOSS_RTOL, _clearly_faster
from ortlab.tune.resultcache import measurement_environment, model_identity, tune_cache_dir

WIN_MARGIN = 0.05  # the candidate must be >= 5 % faster than fp32 in the median of its paired ratios
MIN_ROUNDS, MAX_ROUNDS = 4, 8  # 4 rounds won of 4 passes the sign test (p = 1/16)
BUDGET_S = 8.0  # no new round starts after this once the minimum rounds are done
# ... and none at all after this: on a model too large for the machine (an LLM on a CPU, a machine out of memory)
# MIN_ROUNDS rounds took 43 minutes once; a probe that cannot finish in this keeps fp32 and says how to choose.
HARD_S = 30.0
LOSSES_DECIDE = 2  # two rounds lost: no sign test over at most MAX_ROUNDS rounds can pass (7 of 8 is p = 0.035)
PROBE_VERSION = 2  # 2: bounded by HARD_S (a cut probe says so)


@dataclass
class PrecisionRace:
    """What the probe measured and decided (kept in the run's `auto` record and cached)."""

    chosen: str  # "fp32" or the candidate
    candidate: str  # "bf16" or "fp16"
    ratio: float | None = None  # median of fp32 time / candidate time per round
    wins: int = 0
    rounds: int = 0
    loss_fp32: float | None = None  # on the first measured batch
    loss_candidate: float | None = None
    probe_s: float = 0.0
    verdict: str = ""
    times: dict[str, list[float]] = field(default_factory=dict)
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrecisionRace:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def candidate_precision() -> tuple[str | None, str]:
    """The 16-bit precision worth probing on this machine (or None and why none is)."""
    from ortlab.accel.precision import bf16_availability, fp16_availability

    bf16 = bf16_availability()
    if bf16.available and not bf16.slow:
        return "bf16", bf16.reason
    fp16 = fp16_availability()
    if fp16.available:
        return "fp16", fp16.reason
    return None, f"fp32: no fast 16-bit precision here ({bf16.reason})"


def probe_key(model_path: str, revision: str | None, model: Any, batches: list[dict], candidate: str) -> str:
    """What makes a verdict valid: the machine and libraries, the model (its files and what trains), the shapes."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    blob = {
        "v": PROBE_VERSION,
        "env": measurement_environment(),
        "model": model_identity(model_path, revision),
        "class": type(model).__name__,
        "trainable": trainable,
        "shapes": sorted({str(tuple(b["input_ids"].shape)) for b in batches}),
        "candidate": candidate,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _cached(key: str) -> PrecisionRace | None:
    try:
        probe = PrecisionRace.from_dict(
            json.loads(safeio.read_bytes(tune_cache_dir(), f"precision-{key}.json", 1 << 20))
        )
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if probe.chosen not in ("fp32", probe.candidate):
        return None
    probe.cached = True
    return probe


def _store(key: str, probe: PrecisionRace) -> None:
    try:
        tune_cache_dir().mkdir(parents=True, exist_ok=True)
        safeio.write_json(tune_cache_dir(), f"precision-{key}.json", probe.to_dict(), durable=False)
    except OSError:
        pass  # a read-only cache costs the next run a probe, not a failure


def probe_precision(
    model: Any,
    batches: list[dict],
    *,
    model_path: str,
    revision: str | None = None,
    candidate: str = "bf16",
    use_cache: bool = True,
    progress: Callable[[str], None] = print,
) -> PrecisionRace:
    """fp32 against `candidate` on `model` and `batches` (at least MIN_ROUNDS + 1 of them); see the module doc."""
    if len(batches) < MIN_ROUNDS + 1:
        raise ValueError(f"the precision probe needs {MIN_ROUNDS + 1} batches, got {len(batches)}")
    key = probe_key(model_path, revision, model, batches, candidate)
    if use_cache and (hit := _cached(key)) is not None:
        return hit
    progress(
        f"precision: timing fp32 against {candidate} on this model's batches (a few seconds, {HARD_S:.0f} at most; "
        "once) ..."
    )
    probe = _measure(model, batches, candidate)
    _store(key, probe)
    return probe


def _measure(model: Any, batches: list[dict], candidate: str) -> PrecisionRace:
    import torch

    # The device the trainer will put the model on (it moves it there itself, so moving it first changes nothing).
    device = torch.device("cuda") if torch.cuda.is_available() else next(model.parameters()).device
    model.to(device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[candidate]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    was_training = model.training
    model.train()

    def step(batch: dict, precision: str) -> tuple[float, float]:
        inputs = {k: v.to(device) for k, v in batch.items()}
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=precision != "fp32"):
            loss = model(**inputs).loss
        loss.backward()
        sync()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed, float(loss.detach().float())

    started = time.monotonic()
    times: dict[str, list[float]] = {"fp32": [], candidate: []}
    losses: dict[str, float] = {}
    cut = False  # stopped by HARD_S before the minimum rounds
    try:
        for precision in ("fp32", candidate):  # warm-up: the first call of each prepares its kernels
            if time.monotonic() - started > HARD_S:
                cut = True
                break
            step(batches[0], precision)
        for r, batch in enumerate(batches[1 : MAX_ROUNDS + 1]):
            if cut or time.monotonic() - started > (BUDGET_S if r >= MIN_ROUNDS else HARD_S):
                cut = cut or r < MIN_ROUNDS
                break
            lost = sum(a < b for a, b in zip(times["fp32"], times[candidate], strict=True))
            if lost >= LOSSES_DECIDE:
                break  # it cannot pass the sign test any more: a losing candidate costs two rounds, not eight
            order = ("fp32", candidate) if r % 2 == 0 else (candidate, "fp32")
            for precision in order:
                elapsed, loss = step(batch, precision)
                times[precision].append(elapsed)
                if r == 0:
                    losses[precision] = loss
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return _decide(candidate, times, losses, time.monotonic() - started, cut)


def _decide(
    candidate: str, times: dict[str, list[float]], losses: dict[str, float], spent: float, cut: bool = False
) -> PrecisionRace:
    """fp32 unless the candidate computes the same loss and is clearly faster (the default must never lose)."""
    paired = [a / b for a, b in zip(times["fp32"], times[candidate], strict=True) if b > 0]
    ratio = statistics.median(paired) if paired else None
    wins = sum(p > 1 for p in paired)
    probe = PrecisionRace(
        chosen="fp32",
        candidate=candidate,
        ratio=ratio,
        wins=wins,
        rounds=len(paired),
        loss_fp32=losses.get("fp32"),
        loss_candidate=losses.get(candidate),
        probe_s=spent,
        times=times,
    )
    ref, got = probe.loss_fp32, probe.loss_candidate
    if cut:
        probe.verdict = (
            f"fp32: the probe stopped at its {HARD_S:.0f} s bound after {len(paired)} of {MIN_ROUNDS} rounds (too "
            f"slow to compare here); set accel.precision: {candidate} to train in {candidate}, or measure it with "
            "`ortlab tune`"
        )
    elif got is None or ref is None or not math.isfinite(got):
        probe.verdict = f"fp32: {candidate}'s loss is not finite"
    elif abs(got - ref) > LOSS_ATOL + LOSS_RTOL * abs(ref):
        probe.verdict = f"fp32: {candidate}'s loss {got:.4f} strays from fp32's {ref:.4f} on the same batch"
    elif ratio is None or ratio < 1 + WIN_MARGIN or not _clearly_faster(paired):
        probe.verdict = f"fp32: {candidate} measured {ratio or 0:.2f}x fp32, faster in {wins} of {len(paired)} rounds"
    else:
        probe.chosen = candidate
        probe.verdict = (
            f"{candidate}: measured {ratio:.2f}x fp32, faster in {wins} of {len(paired)} rounds, loss {got:.4f} "
            f"against fp32's {ref:.4f} on the same batch"
        )
    return probe
