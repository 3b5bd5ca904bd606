"""The processor as ortlab sees it: its model and instruction-set flags, read from /proc/cpuinfo without torch.

What is fast on a CPU follows its flags: bf16 matmuls run in hardware only with AVX512_BF16 or AMX, and are 10-100x
slower than fp32 without them (seen on AMD EPYCs without avx512_bf16). The doctor, the measured peak and the
precision rules all read the flags here, so one switch changes what all of them see:

`ORTLAB_HIDE_CPU_FLAGS` (comma-separated flag names) hides those flags, so that a machine with bf16 hardware can be
tested as one without it (`tests/test_doctor_cold_cpu.py`). It only hides: what the processor really runs is
changed by the libraries' own switches (oneDNN's `ONEDNN_MAX_CPU_ISA=AVX2` turns its bf16 kernels off, so a bf16
matmul really is slow). A hidden flag is part of the fingerprint (`cpu_facts`), so the simulated machine has its own
cache entries.
"""

from __future__ import annotations

import hashlib
import os
import platform
from typing import Any

HIDE_ENV = "ORTLAB_HIDE_CPU_FLAGS"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
MAX_CPUINFO_BYTES = 4 << 20  # a few hundred cores' worth


def _read() -> tuple[str, str]:
    """(model name, flags line) of the first processor listed; empty where there is no /proc/cpuinfo."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            text = f.read(MAX_CPUINFO_BYTES)
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value.strip()
        if model and flags:
            break
    return model, flags


def hidden_flags() -> set[str]:
    return {f.strip() for f in os.environ.get(HIDE_ENV, "").split(",") if f.strip()}


def cpu_flags() -> set[str]:
    """The processor's instruction-set flags, less those hidden by $ORTLAB_HIDE_CPU_FLAGS."""
    return set(_read()[1].split()) - hidden_flags()


def bf16_hardware() -> list[str]:
    """The flags that give this CPU bf16 matmuls in hardware (empty: bf16 is emulated here)."""
    flags = cpu_flags()
    return [f for f in BF16_FLAGS if f in flags]


def cpu_facts() -> dict[str, Any]:
    """The CPU model, a hash of its (visible) flags and the cores given to this process: what a measured peak and
    the doctor's answer depend on."""
    model, _ = _read()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    digest = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    return {"model": model or platform.processor(), "machine": platform.machine(), "flags": digest, "cores": cores}
