"""torch.compile: trace the model into graphs and generate fused kernels (Inductor: Triton on GPU, C++ on CPU).

It attacks the same overhead as ORTModule (many small kernels, Python dispatch) with PyTorch's own compiler,
so the two do not stack: a model is either exported to ONNX Runtime or compiled by Inductor, not both.

transformers 5 calls `torch.compiler.is_exporting()`, which torch 2.6 lacks, so in ortlab's ORT runtime
(torch 2.6, pinned by onnxruntime-training) torch.compile cannot run: use a second runtime with a newer torch.
"""

from __future__ import annotations

import shutil
from functools import lru_cache

from ortlab.accel import Availability, package_version


@lru_cache(maxsize=2)
def check(probe: bool = False) -> Availability:
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
            "torch.compile needs a runtime with torch >= 2.7: create one (`python -m venv`, `pip install "
            "'torch>=2.7' ortlab`) and launch the run there; ORT runs stay on torch 2.6",
        )
    if torch.cuda.is_available():
        if package_version("triton") is None:
            return Availability(
                name, False, "Inductor on CUDA needs triton, which is not installed", "pip install triton"
            )
    elif shutil.which("c++") is None and shutil.which("g++") is None:
        return Availability(name, False, "Inductor on CPU needs a C++ compiler", "install g++")
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    return Availability(
        name,
        True,
        f"torch {version}, Inductor on {device} (not compiled in the probe)",
        "the first steps compile (tens of seconds); throughput is steady after",
        details={"torch": version},
    )
