"""What runs on this machine taught the estimator: a small file in ortlab's cache, per machine, bounded, checked.

After a run, the estimate made before it is compared with what it measured (`record`): the memory left over once
the model's terms are taken off (`runtime_mb`: Python, torch and the data on CPU), and the matmul efficiency its
steady steps reached against the measured peak (`efficiency`); and on a CPU which precision 'auto' chose for the
model (`auto_bf16`, under `auto_key`). The estimator then uses the median of the last KEEP values for the same key
(device, model family, precision; or the model, for 'auto') in place of its defaults.

Why so guarded: the file is written by runs and read by every estimate, so a wrong value would mislead every
later run. It lives under `ortlab.envvars.cache_dir()/estimate/` (never in a run folder: a run folder may come from
another machine), names the machine it was measured on (its fingerprint: processor, cores, GPU) and is ignored
elsewhere, holds at most MAX_KEYS keys of at most KEEP values each (MAX_BYTES in all), and every value read is
checked against a plausible range: a file that fails any check is ignored as a whole, not half-trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from typing import Any

from ortlab import safeio
from ortlab.cpuinfo import cpu_facts
from ortlab.envvars import cache_dir

VERSION = 1
FILE = "calibration.json"
KEEP = 8
MAX_KEYS = 32
MAX_BYTES = 64 * 1024
# Plausible ranges: outside them the value is a measurement gone wrong (a run swapped out, a clock jump).
RANGES = {
    "runtime_mb": (50.0, 64_000.0),
    "efficiency": (0.005, 3.0),  # above 1: the measured peak or the other step terms are off; it corrects both
    "act_scale": (0.2, 5.0),
    "startup_s": (0.5, 3600.0),
    "eval_row_s": (1e-6, 60.0),  # seconds per row of an evaluation, measured
    "auto_bf16": (0.0, 1.0),  # 1: precision 'auto' trained this model in bf16 here (the race chose it), 0: fp32
}


def machine() -> str:
    """This machine's fingerprint: what the calibrated constants depend on (processor, cores, the GPU's name)."""
    facts = {"cpu": cpu_facts(), "cores": os.cpu_count(), "gpu": os.environ.get("ORTLAB_ESTIMATE_GPU_NAME", "")}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def key(device: str, family: str, precision: str) -> str:
    return f"{device}/{family}/{precision}"


def auto_key(model_name: str) -> str:
    """The key of what precision 'auto' chose for a model on this machine's CPU (the race is per model: it chose bf16
    for MiniLM here and fp32 for smaller models, where bf16's casts outweigh its faster matmuls)."""
    return f"cpu/auto/{hashlib.sha256(model_name.encode()).hexdigest()[:16]}"


def _folder():
    return cache_dir() / "estimate"


def load() -> dict[str, dict[str, list[float]]]:
    """The calibration of this machine: {key: {quantity: [values]}}; empty when absent, another machine's, or not
    valid in any part."""
    try:
        data = json.loads(safeio.read_bytes(_folder(), FILE, limit=MAX_BYTES))
    except (OSError, ValueError):
        return {}
    return validate(data) or {}


def validate(data: Any) -> dict[str, dict[str, list[float]]] | None:
    """The entries of a calibration file when every part of it is well-formed and this machine's, else None."""
    if not isinstance(data, dict) or data.get("v") != VERSION or data.get("machine") != machine():
        return None
    entries = data.get("entries")
    if not isinstance(entries, dict) or len(entries) > MAX_KEYS:
        return None
    out: dict[str, dict[str, list[float]]] = {}
    for k, values in entries.items():
        if not isinstance(k, str) or len(k) > 120 or not isinstance(values, dict):
            return None
        clean: dict[str, list[float]] = {}
        for name, series in values.items():
            if name not in RANGES or not isinstance(series, list) or not 0 < len(series) <= KEEP:
                return None
            lo, hi = RANGES[name]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi for v in series):
                return None
            clean[name] = [float(v) for v in series]
        out[k] = clean
    return out


def value(entries: dict[str, dict[str, list[float]]], k: str, name: str) -> float | None:
    series = entries.get(k, {}).get(name)
    return statistics.median(series) if series else None


def record(k: str, measured: dict[str, float]) -> bool:
    """Add a run's measured quantities under key `k` (the oldest values and keys make room); False when a value
    is out of range (not recorded) or the cache cannot be written (a read-only home costs nothing but learning)."""
    good = {n: float(v) for n, v in measured.items() if n in RANGES and RANGES[n][0] <= v <= RANGES[n][1]}
    if not good:
        return False
    entries = load()
    entry = entries.pop(k, {})  # re-inserted last: the most recently used keys are kept
    for name, v in good.items():
        entry[name] = [*entry.get(name, []), v][-KEEP:]
    entries[k] = entry
    while len(entries) > MAX_KEYS:
        entries.pop(next(iter(entries)))
    data = {"v": VERSION, "machine": machine(), "updated": time.time(), "entries": entries}
    try:
        _folder().mkdir(parents=True, exist_ok=True)
        safeio.write_json(_folder(), FILE, data, durable=False)
    except OSError:
        return False
    return True
