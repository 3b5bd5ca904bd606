"""The doctor on CUDA: what this machine's GPUs can run, found by running it on them.

`probe_cuda()` runs in the doctor's torch probe subprocess (a crashing CUDA driver must not take the notebook
with it). Each kernel path is tried for real on device 0 with tiny tensors: SDPA's flash and memory-efficient
kernels forward and backward (each forced alone, so a silent fallback to the math kernel cannot pass for it),
torch's fused AdamW step, a tiny `torch.compile` through Inductor (which needs Triton on CUDA), and an NCCL
all-reduce in a one-process group. `findings()` turns that record into the doctor's rows (yes / no / not checked,
each with its reason and remedy), so the rows can be tested from a recorded (or constructed) probe output on a
machine without a GPU.

ORT on CUDA is reported by what is missing, never as available: onnxruntime-training 1.19.2's CUDA provider is
built for CUDA 11.8 (CPython <= 3.11, torch <= 2.6), so it needs CUDA 11 libraries beside torch's (`nvidia-*-cu11`
on PyPI) and `nvcc` to build ORTModule's CUDA extensions. ortlab has never observed it train on a GPU; a run that
asks for ORT is verified by the trainer (`accelerations["ort"]`), whatever the doctor says.

    python -m ortlab.gpu          prints this machine's probe record as JSON (to replace a constructed fixture)
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ortlab.accel import package_version

# onnxruntime-training 1.19.2 (CUDA 11.8) loads these; PyPI ships them as the nvidia-*-cu11 wheels.
ORT_CUDA11_LIBS: dict[str, str] = {
    "libcudart.so.11.0": "nvidia-cuda-runtime-cu11",
    "libcublas.so.11": "nvidia-cublas-cu11",
    "libcublasLt.so.11": "nvidia-cublas-cu11",
    "libcufft.so.10": "nvidia-cufft-cu11",
    "libcurand.so.10": "nvidia-curand-cu11",
    "libcudnn.so.8": "nvidia-cudnn-cu11",
}
ORT_LAST = "onnxruntime-training==1.19.2"
NOT_CHECKED = (
    "ZeRO-1 across several GPUs (the doctor runs one process; a run records each rank's optimizer share)",
    "NCCL between GPUs and between nodes (the probe's all-reduce runs in a one-process group)",
    "ORT training on CUDA (never run by the doctor; a run's record says whether ORT applied)",
    "sustained throughput and MFU (benchmarks/bench_gpu.py measures them)",
)


def _try(fn: Any) -> dict[str, Any]:
    try:
        value = fn()
        return {"ok": True, **(value or {})}
    except Exception as e:  # each probe reports its own failure; the others still run
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e) else ''}"}


def probe_cuda() -> dict[str, Any]:
    """Probe the CUDA devices for real (device 0 for kernels). JSON-able; `available` False without CUDA."""
    import torch

    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    out["ort_cuda"] = ort_cuda_facts()
    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch has CUDA but no device is visible"
        return {**out, "available": False, "reason": why, "count": 0, "devices": []}
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "multiprocessors": p.multi_processor_count,
            }
        )
    out.update(available=True, reason="", count=len(devices), devices=devices)
    out["bf16"] = bool(torch.cuda.is_bf16_supported())
    out["tf32"] = torch.cuda.get_device_capability(0) >= (8, 0)
    out["sdpa"] = {name: _try(lambda n=name: _sdpa(n)) for name in ("flash", "mem_efficient")}
    out["fused_adamw"] = _try(_fused_adamw)
    out["compile"] = _try(_compile)
    out["compile"]["triton"] = package_version("triton")
    out["nccl"] = _try(_nccl)
    out["deepspeed"] = {"version": package_version("deepspeed")}
    out["nvml"] = _try(_nvml)
    return out


def _sdpa(kernel: str) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "mem_efficient": SDPBackend.EFFICIENT_ATTENTION}[kernel]
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    with sdpa_kernel([backend]):  # only this kernel: no silent fallback to the math kernel
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    torch.cuda.synchronize()
    return {"dtype": "float16"}


def _fused_adamw() -> dict[str, Any]:
    import torch

    p = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    p.grad = torch.randn_like(p)
    opt.step()
    torch.cuda.synchronize()
    return {}


def _compile() -> dict[str, Any]:
    import torch

    f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x).sum(), backend="inductor")
    f(torch.randn(32, 32, device="cuda"))
    torch.cuda.synchronize()
    return {"backend": "inductor"}


def _nccl() -> dict[str, Any]:
    import socket

    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        raise RuntimeError("this torch was built without NCCL")
    if dist.is_initialized():
        return {"version": ".".join(map(str, torch.cuda.nccl.version())), "note": "a process group already exists"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
    return {"version": ".".join(map(str, torch.cuda.nccl.version()))}


def _nvml() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {"utilisation_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}


def ort_cuda_facts() -> dict[str, Any]:
    """What ORT training on CUDA would need, read without importing onnxruntime (its import takes seconds)."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": package_version("torch"),
        "onnxruntime_training": package_version("onnxruntime-training"),
        "ort_cuda_version": None,
        "libs": {},
        "nvcc": None,
        "cuda_extensions": None,
    }
    spec = importlib.util.find_spec("onnxruntime")
    if spec is not None and spec.origin:
        info = Path(spec.origin).parent / "capi" / "build_and_package_info.py"
        match = re.search(r"cuda_version\s*=\s*['\"]([^'\"]*)['\"]", info.read_text()) if info.is_file() else None
        facts["ort_cuda_version"] = match.group(1) if match else None
        ext = Path(spec.origin).parent / "training" / "ortmodule" / "torch_cpp_extensions"
        if ext.is_dir():
            facts["cuda_extensions"] = sorted(p.name for p in ext.glob("*.so") if "gpu" in p.name or "fused" in p.name)
    for lib in ORT_CUDA11_LIBS:
        try:
            ctypes.CDLL(lib)
            facts["libs"][lib] = True
        except OSError:
            facts["libs"][lib] = bool(_in_nvidia_wheels(lib))
    nvcc = shutil.which("nvcc") or (
        os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else None
    )
    if nvcc and os.path.exists(nvcc):
        try:
            text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20).stdout
            release = re.search(r"release ([\d.]+)", text)
            facts["nvcc"] = release.group(1) if release else "unknown version"
        except (OSError, subprocess.SubprocessError):
            facts["nvcc"] = None
    return facts


def _in_nvidia_wheels(lib: str) -> Path | None:
    """The nvidia-*-cu11 wheels put their libraries under site-packages/nvidia/*/lib (not on the loader's path)."""
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        for path in Path(root).glob(f"*/lib/{lib}"):
            return path
    return None


# --- the doctor's rows --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "yes", "no", "not checked"
    reason: str
    remedy: str = "nothing to do"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def findings(probe: dict[str, Any]) -> list[Finding]:
    """The doctor's GPU rows from a `probe_cuda()` record (this machine's, or a recorded one)."""
    if not probe.get("available"):
        rows = [
            Finding(
                "cuda",
                "no",
                f"no CUDA device: {probe.get('reason', 'not probed')}",
                "on a GPU machine, install a CUDA build of torch (or use the one there) and `pip install ortlab`",
            )
        ]
        return [*rows, ort_on_cuda(probe.get("ort_cuda") or {})]
    d0 = probe["devices"][0]
    names = ", ".join(f"{d['name']} ({d['capability']}, {d['memory_gib']} GiB)" for d in probe["devices"])
    rows = [
        Finding("cuda", "yes", f"{probe['count']} GPU(s): {names}; torch {probe['torch']}, CUDA {probe['cuda_build']}"),
        Finding("fp16", "yes", "fp16 autocast with dynamic loss scaling (GradScaler)"),
        Finding(
            "bf16",
            "yes" if probe.get("bf16") else "no",
            f"{d0['name']} {'supports' if probe.get('bf16') else 'lacks'} bf16 (Ampere, 8.0, or newer)",
            "nothing to do" if probe.get("bf16") else "use fp16 on this GPU",
        ),
        Finding(
            "tf32",
            "yes" if probe.get("tf32") else "no",
            f"compute capability {d0['capability']}: " + ("TF32 tensor cores" if probe.get("tf32") else "no TF32"),
            "nothing to do (tf32 'auto' turns it on)" if probe.get("tf32") else "use fp16 for tensor-core speed",
        ),
    ]
    for kernel, label in (("flash", "SDPA flash attention"), ("mem_efficient", "SDPA memory-efficient attention")):
        r = probe.get("sdpa", {}).get(kernel, {})
        rows.append(
            Finding(
                f"sdpa_{kernel}",
                "yes" if r.get("ok") else "no",
                f"{label}: forward and backward ran alone on the GPU (fp16)"
                if r.get("ok")
                else f"{label} failed when forced alone: {r.get('error', 'not probed')}",
                "nothing to do" if r.get("ok") else "transformers falls back to another SDPA kernel by itself",
            )
        )
    r = probe.get("fused_adamw", {})
    failed = f"fused AdamW failed: {r.get('error')}"
    rows.append(
        Finding(
            "fused_adam",
            "yes" if r.get("ok") else "no",
            "torch.optim.AdamW(fused=True) stepped on the GPU"
            if r.get("ok")
            else f"fused AdamW failed: {r.get('error')}",
            "nothing to do" if r.get("ok") else "use optim='adamw_torch' (unfused)",
        )
    )
    r = probe.get("compile", {})
    triton = r.get("triton")
    failed = f"torch.compile failed on the GPU: {r.get('error')}" + ("" if triton else " (Triton is not installed)")
    rows.append(
        Finding(
            "torch_compile",
            "yes" if r.get("ok") else "no",
            f"Inductor compiled and ran a function on the GPU (Triton {triton})" if r.get("ok") else failed,
            "nothing to do" if r.get("ok") else "pip install triton (the version your torch names), then doctor again",
        )
    )
    r = probe.get("nccl", {})
    ds = (probe.get("deepspeed") or {}).get("version")
    nccl = f"NCCL {r.get('version')} all-reduce ran (one process)" if r.get("ok") else f"NCCL failed: {r.get('error')}"
    rows.append(
        Finding(
            "zero1",
            "yes" if r.get("ok") and ds else "no",
            nccl + (f"; DeepSpeed {ds}" if ds else "; DeepSpeed is not installed"),
            "nothing to do" if r.get("ok") and ds else "pip install deepspeed (and a torch built with NCCL)",
        )
    )
    r = probe.get("nvml", {})
    rows.append(
        Finding(
            "nvml",
            "yes" if r.get("ok") else "no",
            f"GPU utilisation readable ({r.get('utilisation_pct')}% now): runs record it per step"
            if r.get("ok")
            else "NVML not readable: runs do not record GPU utilisation",
            "nothing to do" if r.get("ok") else "pip install nvidia-ml-py",
        )
    )
    rows.append(ort_on_cuda(probe.get("ort_cuda") or {}))
    rows += [Finding("not checked", "not checked", what, "") for what in NOT_CHECKED]
    return rows


def ort_on_cuda(facts: dict[str, Any]) -> Finding:
    """ORT training on CUDA: what is missing and how to get it. Never "yes": the doctor does not run it."""
    missing: list[str] = []
    python = tuple(int(x) for x in str(facts.get("python", "0.0")).split(".")[:2])
    if python > (3, 11):
        missing.append(
            f"Python {facts.get('python')}: {ORT_LAST} has wheels for CPython 3.8-3.11 only; make a Python 3.11 "
            "environment for it (the ORT runtime: ortlab's requirements/dev.lock, or `pip install 'ortlab[ort]'`)"
        )
    torch = str(facts.get("torch") or "")
    if torch and tuple(int(x) for x in re.findall(r"\d+", torch)[:2]) > (2, 6):
        missing.append(f"torch {torch}: ORTModule imports with torch <= 2.6 only; install torch==2.6.0 there")
    if not facts.get("onnxruntime_training"):
        missing.append(f"onnxruntime-training is not installed: pip install {ORT_LAST}")
    elif facts.get("ort_cuda_version") in (None, ""):
        missing.append("the installed onnxruntime-training is a CPU build: install the CUDA 11.8 build")
    absent = sorted({pkg for lib, ok in (facts.get("libs") or {}).items() if not ok for pkg in [ORT_CUDA11_LIBS[lib]]})
    if absent:
        missing.append(
            f"CUDA 11 libraries next to torch's: pip install {' '.join(absent)} (and put their lib folders on "
            "LD_LIBRARY_PATH)"
        )
    if not facts.get("nvcc"):
        missing.append(
            "nvcc (a CUDA 11.8 toolkit) to build ORTModule's CUDA extensions: install it, set CUDA_HOME, then run "
            "python -m onnxruntime.training.ortmodule.torch_cpp_extensions.install"
        )
    elif not facts.get("cuda_extensions"):
        missing.append(
            "ORTModule's CUDA extensions are not built: python -m onnxruntime.training.ortmodule.torch_cpp_extensions"
            ".install"
        )
    if missing:
        return Finding("ort (CUDA)", "no", "missing: " + "; ".join(missing), "see each item; or train without ORT")
    return Finding(
        "ort (CUDA)",
        "not checked",
        f"the prerequisites are present (ORT built for CUDA {facts.get('ort_cuda_version')}, nvcc "
        f"{facts.get('nvcc')}); the doctor does not train with ORT on the GPU",
        "a run with ORT records whether ORTModule really trained (never assumed)",
    )


if __name__ == "__main__":
    import json

    print(json.dumps(probe_cuda(), indent=2))
