"""The machine's dense matmul peak, measured: the honest denominator of MFU where no datasheet has one.

A CPU has no published dense peak per precision that a run could be held against: it depends on the cores given
to the process, their clocks, the vector and matrix units (AVX-512, AVX512_BF16, AMX) and the torch build that
drives them (torch 2.13's bf16 matmuls run 1.65x faster than torch 2.6's on the same Xeon). So ortlab measures it
where the run trains: square matmuls of the precision the run's matmuls use, on the threads training will use,
timed after a warm-up, the best of several short repeats (a peak is the best the machine gave, not the average of
a busy moment). On a GPU the same measurement sits beside the datasheet's peak: the datasheet says what the chip
can do, the measurement what this machine, driver and torch give.

A measurement takes about a second per precision and is cached under `ortlab.envvars.cache_dir()/peak/`, keyed by
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
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.envvars import cache_dir

# The precisions measured per device kind: what the run's matmuls can compute in there. "tf32" is an fp32 run
# whose matmuls use TF32 tensor cores (NVIDIA Ampere and newer); CPUs have no fp16 training path in ortlab.
PRECISIONS = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16")}
# Matrix side per device kind: large enough that the matmul runs at its steady rate (2048 reaches it on a few CPU
# cores; a large GPU needs 8192), small enough to measure in about a second.
SIZE = {"cpu": 2048, "cuda": 8192}
MIN_SIZE = 256
REPEATS = 5
REPEAT_S = 0.12  # each repeat runs matmuls for about this long; the best repeat is the peak
# One warm-up matmul slower than this (an emulated precision): halve the side and retry. Not lower: a busy machine
# made a 2048-side bf16 matmul take 0.3 s, and a halved side understated the peak (smaller matmuls run slower).
SLOW_CALL_S = 1.0
CACHE_VERSION = 1
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasuredPeak:
        fields = cls.__dataclass_fields__
        if not isinstance(data, dict) or set(fields) - set(data):
            raise ValueError("not a measured peak")
        peak = cls(**{k: data[k] for k in fields})
        if not isinstance(peak.flops, (int, float)) or not peak.flops > 0:
            raise ValueError("a measured peak must be a positive number of FLOP/s")
        return peak


def _dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def _device_name(device_type: str, index: int = 0) -> str:
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(index)
    return "cpu"


def measure(precision: str, device_type: str = "cpu", index: int = 0) -> MeasuredPeak:
    """Time square matmuls of `precision` on the device (about a second) and return the best rate seen."""
    import torch

    if precision not in PRECISIONS.get(device_type, ()):
        raise ValueError(f"no {precision} peak is measured on {device_type}: choose one of {PRECISIONS[device_type]}")
    device = torch.device(device_type, index) if device_type == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda *_: None)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        n = SIZE[device_type]
        # A generator of its own: a run measures its peak after the trainer seeded the global random state, and
        # drawing from that would change the run's dropout masks and data order (the same run, another result).
        generator = torch.Generator(device=device).manual_seed(0)
        while True:
            a = torch.randn(n, n, device=device, generator=generator).to(_dtype(precision))
            b = torch.randn(n, n, device=device, generator=generator).to(_dtype(precision))
            a @ b  # the first call picks and prepares kernels (oneDNN, cuBLAS): not timed
            sync(device)
            t = time.perf_counter()
            a @ b
            sync(device)
            if time.perf_counter() - t < SLOW_CALL_S or n <= MIN_SIZE:
                break
            n //= 2  # an emulated precision: a smaller matrix keeps the measurement near a second
        best = float("inf")
        with torch.no_grad():
            for _ in range(REPEATS):
                calls, start = 0, time.perf_counter()
                while True:
                    a @ b
                    calls += 1
                    sync(device)
                    elapsed = time.perf_counter() - start
                    if elapsed >= REPEAT_S:
                        break
                best = min(best, elapsed / calls)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return MeasuredPeak(
        device=_device_name(device_type, index),
        precision=precision,
        flops=2 * n**3 / best,
        size=n,
        threads=torch.get_num_threads(),
        measured_at=time.time(),
        torch=torch.__version__,
    )


def fingerprint(device_type: str = "cpu", index: int = 0) -> dict[str, Any]:
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


def cpu_facts() -> dict[str, Any]:
    """The CPU model and a hash of its flags (bf16 and AVX-512 support change what is fast); read without torch."""
    model, flags = platform.processor(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return {"model": model, "machine": platform.machine(), "flags": digest, "cores": cores}


def _cache_path(facts: dict[str, Any], precision: str) -> Path:
    key = hashlib.sha256(json.dumps({**facts, "precision": precision}, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / "peak" / f"{key}.json"


def cached_peak(precision: str, device_type: str = "cpu", index: int = 0) -> MeasuredPeak | None:
    """The cached measurement for this machine, or None (never measured, another machine, or an unreadable file)."""

    facts = fingerprint(device_type, index)
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
    _store(fingerprint(device_type, index), peak)
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
