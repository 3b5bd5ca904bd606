"""The machine's dense matmul peak, measured: the honest denominator of MFU where no datasheet has one.

A CPU has no published dense peak per precision that a run could be held against: it depends on the cores given
to the process, their clocks, the vector and matrix units (AVX-512, AVX512_BF16, AMX) and the torch build that
drives them (torch 2.13's bf16 matmuls run 1.65x faster than torch 2.6's on the same Xeon). So ortlab measures it
where the run trains: square matmuls of the precision the run's matmuls use, on the threads training will use,
timed after a warm-up, the best of several short repeats (a peak is the best the machine gave, not the average of
a busy moment). On a GPU the same measurement sits beside the datasheet's peak: the datasheet says what the chip
can do, the measurement what this machine, driver and torch give.

A measurement takes a few seconds per precision at most, on any device: it is bounded by time, not by a matrix size,
and a precision the CPU has no hardware for is measured briefly and recorded as such (`hardware: False`), never
left to time out. It is cached under `ortlab.envvars.cache_dir()/peak/`, keyed by
everything it depends on (torch's version, the processor and its flags, the thread count, the GPU); change any of
them and it is measured again. `measured_peak(precision)` answers from the cache or measures;
`measure_all(refresh=True)` (what the doctor's probe calls) measures every precision of the device again and keeps
the higher of that and the cached value: a peak is the best the machine gave, and one measured while other work
ran (it happens: 0.148 and 0.100 TFLOP/s fp32 on the same busy machine) would flatter every run's MFU.

This module imports torch only inside its functions.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.cpuinfo import bf16_hardware, cpu_facts
from ortlab.envvars import cache_dir

# The precisions measured per device kind: what the run's matmuls can compute in there. "tf32" is an fp32 run
# whose matmuls use TF32 tensor cores (NVIDIA Ampere and newer); CPUs have no fp16 training path in ortlab.
PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16")}
# The measurement is bounded by time, never by a matrix size (issue #42: a fixed 2048-side bf16 matmul took 34 s on a
# CPU without bf16 units, and the doctor's peak probe timed out there on every call). The side starts at MIN_SIZE and
# doubles while one matmul of the doubled side would take under CALL_S, up to SIZE: large enough that the matmul runs
# at its steady rate (2048 reaches it on a few CPU cores; a large GPU needs 8192), never a call that takes seconds.
# Not lower: a busy machine made a 2048-side fp32 matmul take 0.3 s, and a smaller side understates the peak.
SIZE = {"cpu": 2048, "cuda": 8192}
MIN_SIZE = 256
CALL_S = 1.0
# Then repeats of about REPEAT_S each; the best repeat is the peak. They stop once the best has not improved by more
# than STABLE over the last STABLE_REPEATS repeats (at least MIN_REPEATS), or at MAX_REPEATS, or when the budget is
# spent: BUDGET_S a precision, calibration included; EMULATED_BUDGET_S for a precision the CPU has no hardware for
# (its rate matters only to say how slow it is).
REPEAT_S = 0.12
MIN_REPEATS = 3
MAX_REPEATS = 8
STABLE = 0.02
STABLE_REPEATS = 2
BUDGET_S = 4.0
EMULATED_BUDGET_S = 1.0
CACHE_VERSION = 2  # 2: bounded by time; `repeats`, `hardware` and `seconds` recorded
MAX_CACHE_BYTES = 64 * 1024


@dataclass(frozen=True)
class MeasuredPeak:
    """One measured dense matmul rate: FLOP/s of `precision` on `device`, how and when it was measured."""

    device: str  # "cpu" or the GPU's name
    precision: str
    flops: float
    size: int  # the side of the square matrices
    threads: int  # torch's intra-op threads during the measurement (CPU)
    measured_at: float
    torch: str
    repeats: int = 0  # how many repeats the measurement took before it was stable (or its budget was spent)
    # Whether the device computes this precision in hardware: False for bf16 on a CPU without AVX512_BF16 or AMX
    # (emulated, 10-100x slower than fp32), None where ortlab does not tell (a GPU: its rows in the doctor say).
    hardware: bool | None = None
    seconds: float = 0.0  # what measuring took

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasuredPeak:
        fields = cls.__dataclass_fields__
        if not isinstance(data, dict) or set(fields) - set(data):
            raise ValueError("not a measured peak")
        peak = cls(**{k: data[k] for k in fields})
        if not isinstance(peak.size, int) or not isinstance(peak.repeats, int):
            raise ValueError("a measured peak's size and repeats are whole numbers")
        if not isinstance(peak.flops, (int, float)) or not peak.flops > 0:
            raise ValueError("a measured peak must be a positive number of FLOP/s")
        return peak


def _set_tf32(torch: Any, on: bool) -> Callable[[], None]:
    """Turn TF32 matmuls on or off for a measurement; returns what puts the setting back. torch >= 2.9's
    `fp32_precision` where it exists: after it was set, touching the legacy `allow_tf32` raises (torch 2.11)."""
    matmul = torch.backends.cuda.matmul
    if isinstance(getattr(matmul, "fp32_precision", None), str):
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if on else "ieee"
        return lambda: setattr(matmul, "fp32_precision", before)
    before = matmul.allow_tf32
    matmul.allow_tf32 = on
    return lambda: setattr(matmul, "allow_tf32", before)


def _dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def _device_name(device_type: str, index: int = 0) -> str:
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(index)
    return "cpu"


def hardware(precision: str, device_type: str = "cpu") -> bool | None:
    """Does the device compute `precision` in hardware? On a CPU fp32 always, bf16 with AVX512_BF16 or AMX (its
    flags, `ortlab.cpuinfo`); None on a GPU (the doctor's CUDA rows say what the GPU has)."""
    if device_type != "cpu":
        return None
    return precision == "fp32" or bool(bf16_hardware())


def measure(precision: str, device_type: str = "cpu", index: int = 0, budget_s: float | None = None) -> MeasuredPeak:
    """Time square matmuls of `precision` on the device and return the best rate seen, in about `budget_s` (default
    BUDGET_S, EMULATED_BUDGET_S for a precision the CPU has no hardware for) however slow the device is."""
    import torch

    if precision not in PRECISIONS.get(device_type, ()):
        raise ValueError(f"no {precision} peak is measured on {device_type}: choose one of {PRECISIONS[device_type]}")
    in_hardware = hardware(precision, device_type)
    if budget_s is None:
        budget_s = EMULATED_BUDGET_S if in_hardware is False else BUDGET_S
    started = time.perf_counter()
    device = torch.device(device_type, index) if device_type == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda *_: None)
    restore_tf32 = _set_tf32(torch, precision == "tf32")
    # A generator of its own: a run measures its peak after the trainer seeded the global random state, and drawing
    # from that would change the run's dropout masks and data order (the same run, another result).
    generator = torch.Generator(device=device).manual_seed(0)

    def operands(n: int) -> tuple[Any, Any, float]:
        """Two n x n matrices and the time of one matmul of them: the first call, which also picks and prepares
        the kernels (oneDNN, cuBLAS), then a second one, unless the first already took longer than CALL_S."""
        a = torch.randn(n, n, device=device, generator=generator).to(_dtype(precision))
        b = torch.randn(n, n, device=device, generator=generator).to(_dtype(precision))
        for _ in range(2):
            t = time.perf_counter()
            a @ b
            sync(device)
            call_s = time.perf_counter() - t
            if call_s > CALL_S:
                break
        return a, b, call_s

    try:
        with torch.no_grad():
            n = MIN_SIZE
            a, b, call_s = operands(n)
            # A side twice as long is 8x the work: grow while that stays a short call and two of them fit in what is
            # left of the budget. An emulated precision can slow down far more than 8x as its matrices leave the
            # caches (bf16 without hardware: 2 GFLOP/s at 512, 0.6 at 1024): a side whose call ran past CALL_S is
            # given up for the one before.
            while n < SIZE[device_type]:
                left = budget_s - (time.perf_counter() - started)
                if call_s * 8 > CALL_S or 2 * call_s * 8 > left:
                    break
                bigger = operands(2 * n)
                if bigger[2] > CALL_S:
                    break
                n *= 2
                a, b, call_s = bigger
            best, repeats, since_better = float("inf"), 0, 0
            while repeats < MAX_REPEATS:
                calls, start = 0, time.perf_counter()
                while True:
                    a @ b
                    calls += 1
                    sync(device)
                    elapsed = time.perf_counter() - start
                    if elapsed >= REPEAT_S:
                        break
                repeats += 1
                per_call = elapsed / calls
                since_better = 0 if per_call < best * (1 - STABLE) else since_better + 1
                best = min(best, per_call)
                if repeats >= MIN_REPEATS and since_better >= STABLE_REPEATS:
                    break
                if time.perf_counter() - started >= budget_s:
                    break
    finally:
        restore_tf32()
    return MeasuredPeak(
        device=_device_name(device_type, index),
        precision=precision,
        flops=2 * n**3 / best,
        size=n,
        threads=torch.get_num_threads(),
        measured_at=time.time(),
        torch=torch.__version__,
        repeats=repeats,
        hardware=in_hardware,
        seconds=round(time.perf_counter() - started, 3),
    )


def peak_fingerprint(device_type: str = "cpu", index: int = 0) -> dict[str, Any]:
    """Everything a measured peak depends on: change one and the cached value is not reused."""
    import torch

    facts: dict[str, Any] = {
        "v": CACHE_VERSION,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_facts(),
        "device": _device_name(device_type, index),
    }
    if device_type == "cpu":
        facts["threads"] = torch.get_num_threads()
    return facts


def _cache_path(facts: dict[str, Any], precision: str) -> Path:
    key = hashlib.sha256(json.dumps({**facts, "precision": precision}, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "peak" / f"{key}.json"


def cached_peak(precision: str, device_type: str = "cpu", index: int = 0) -> MeasuredPeak | None:
    """The cached measurement for this machine, or None (never measured, another machine, or an unreadable file)."""

    facts = peak_fingerprint(device_type, index)
    path = _cache_path(facts, precision)
    try:
        data = json.loads(safeio.read_bytes(path.parent, path.name, limit=MAX_CACHE_BYTES))
        if data.get("fingerprint") != facts:
            return None
        return MeasuredPeak.from_dict(data["peak"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def measured_peak(
    precision: str, device_type: str = "cpu", index: int = 0, refresh: bool = False
) -> tuple[MeasuredPeak, bool]:
    """The peak of `precision` here: (the measurement, whether it came from the cache). Measures when not cached."""
    hit = cached_peak(precision, device_type, index)
    if hit is not None and not refresh:
        return hit, True
    peak = measure(precision, device_type, index)
    if hit is not None and hit.flops >= peak.flops:
        # A peak is the best the machine gave: a measurement on a busier moment does not lower it (a lower peak
        # would flatter every run's MFU).
        return hit, True
    _store(peak_fingerprint(device_type, index), peak)
    return peak, False


def measure_all(device_type: str = "cpu", index: int = 0, refresh: bool = False) -> dict[str, dict[str, Any]]:
    """Every precision of the device, measured (or from the cache): {precision: peak as a dict, or an error}."""
    out: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS[device_type]:
        try:
            peak, was_cached = measured_peak(precision, device_type, index, refresh)
            out[precision] = {**peak.to_dict(), "cached": was_cached}
        except Exception as e:  # a precision the build lacks (an old CPU build's fp16) costs the others nothing
            out[precision] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def _store(facts: dict[str, Any], peak: MeasuredPeak) -> None:
    """Best effort: a read-only home must not make a run fail (it measures again next time)."""

    path = _cache_path(facts, peak.precision)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safeio.write_json(path.parent, path.name, {"fingerprint": facts, "peak": peak.to_dict()}, durable=False)
    except OSError:
        pass
