"""torch.compile: trace the model into graphs and generate fused kernels (Inductor: Triton on GPU, C++ on CPU).

It attacks the same overhead as ORTModule (many small kernels, Python dispatch) with PyTorch's own compiler,
so the two do not stack: a model is either exported to ONNX Runtime or compiled by Inductor, not both.

transformers 5 calls `torch.compiler.is_exporting()`, which torch 2.6 lacks, so in ortlab's ORT runtime
(torch 2.6, pinned by onnxruntime-training) torch.compile cannot run: use a second runtime with a newer torch.
"""

from __future__ import annotations

import shutil
from functools import lru_cache
from typing import Any

from ortlab.accel import Availability, package_version


@lru_cache(maxsize=2)
def availability(probe: bool = False) -> Availability:
    """Static checks only: a real compile takes ~20 s on CPU, too slow for the doctor; a failure shows at run."""
    name = "torch_compile"
    version = package_version("torch")
    if version is None:
        return Availability(name, False, "torch is not installed", "pip install torch")
    import torch

    if not hasattr(torch.compiler, "is_exporting"):
        return Availability(
            name,
            False,
            f"torch {version}: transformers 5 needs torch.compiler.is_exporting (torch >= 2.7) to compile",
            "`ortlab runtime create compile` builds a second runtime with torch >= 2.7 (no ORT); runs that ask "
            "for torch_compile then go there by themselves. ORT runs stay on torch 2.6",
            details={"torch": version, "needs_newer_torch": True},
        )
    compiler = shutil.which("c++") or shutil.which("g++")
    if torch.cuda.is_available():
        if package_version("triton") is None:
            return Availability(
                name, False, "Inductor on CUDA needs triton, which is not installed", "pip install triton"
            )
    elif compiler is None:
        return Availability(name, False, "Inductor on CPU needs a C++ compiler", "install g++")
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    details: dict[str, Any] = {"torch": version, "device": device, "compiler": compiler}
    if probe:
        # Inductor is a part of torch that can fail to import on its own (a broken install, a missing module);
        # the compiler's version line is what a user needs when a compile fails.
        try:
            import torch._inductor
        except Exception as e:
            return Availability(name, False, f"torch {version}: Inductor does not import ({e})", "reinstall torch")
        details["inductor"] = True
        details["compiler_version"] = _first_line([compiler, "--version"]) if compiler else None
    return Availability(
        name,
        True,
        f"torch {version}, Inductor on {device} (not compiled in the probe)",
        "the first steps compile (tens of seconds); throughput is steady after",
        details=details,
    )


def _first_line(cmd: list[str]) -> str | None:
    import subprocess

    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip().splitlines() or [None])[0]
