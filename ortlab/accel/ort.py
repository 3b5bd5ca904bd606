"""ONNX Runtime training: run the model's forward and backward inside ORTModule.

`ORTModule(model)` exports the PyTorch model to an ONNX graph on its first forward pass, builds the gradient
graph, and from then on runs both passes with ONNX Runtime's kernels and graph optimizations (operator fusion,
memory planning); the optimizer and everything else stay PyTorch. The published speed-ups (1.2x-2.3x in the
Optimum blog) are GPU results; on a CPU it is usually slower than eager PyTorch, and the export costs seconds
up front.

What this module knows that users used to learn the hard way:
- onnxruntime-training 1.19.2 is the last release. Its wheels stop at CPython 3.11 and its interop extension
  breaks on torch >= 2.7, so the usable runtime is torch 2.6 (the newest torch transformers 5 also accepts).
- ORTModule needs two C++ torch extensions compiled into its package folder before first use
  (`build_extensions()` below does it; ORT's own installer also tries CUDA ones and fails without nvcc).
- By default ORTModule *silently* falls back to PyTorch when export fails; ortlab detects that and reports
  it (or fails, if asked), so nobody benchmarks eager PyTorch believing it is ORT.

Three modules, one question each (every public name is importable from here):
- ort.py          can ORTModule train here? (`availability`: versions, extensions, a probe) and the extension build.
- ort_module.py   wrapping a model in ORTModule (`prepare_model`, `wrap`, CPU session settings) and reading back
                  whether it really ran in ONNX Runtime (`fallback_reason`, `ran_in_ort`, `force_fallback`).
- ort_capture.py  can the model's forward be captured as a graph? (`python_effects_of_forward`, pure PyTorch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from ortlab.accel import NOT_PROBED, Availability, package_version
from ortlab.accel.ort_capture import ForwardNotCapturable, python_effects_of_forward
from ortlab.accel.ort_module import (
    CPU_SESSION,
    LOG_LEVELS,
    MAX_ERROR_CHARS,
    ORTFallbackError,
    ORTOptions,
    configure_session,
    describe_error,
    fallback_reason,
    force_fallback,
    is_ort_error,
    prepare_model,
    ran_in_ort,
    unsupported_operator,
    wrap,
)

# What this module is, for everyone who imports it: its availability and the build here, the wrapping re-exported.
__all__ = [
    "CPU_SESSION",
    "EXTENSIONS",
    "INSTALL_HINT",
    "LOG_LEVELS",
    "MAX_ERROR_CHARS",
    "MAX_PYTHON",
    "MAX_TORCH",
    "ForwardNotCapturable",
    "ORTFallbackError",
    "ORTOptions",
    "availability",
    "build_extensions",
    "configure_session",
    "describe_error",
    "extensions_built",
    "extensions_dir",
    "fallback_reason",
    "force_fallback",
    "is_ort_error",
    "prepare_model",
    "python_effects_of_forward",
    "ran_in_ort",
    "unsupported_operator",
    "wrap",
]

EXTENSIONS = ("aten_op_executor", "torch_interop_utils")
MAX_TORCH = (2, 7)  # exclusive
MAX_PYTHON = (3, 11)  # inclusive
INSTALL_HINT = "pip install 'ortlab[ort]' in a Python 3.11 environment (or run `scripts/dev setup` in the repo)"


def extensions_dir() -> Path | None:
    """Where ORTModule looks for its C++ extensions, found without importing onnxruntime (that takes seconds)."""
    from importlib.util import find_spec

    spec = find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "training" / "ortmodule" / "torch_cpp_extensions"


def _built_for() -> str:
    return f"torch {package_version('torch')}, onnxruntime-training {package_version('onnxruntime-training')}"


def extensions_built() -> bool:
    """True when both extensions exist and were built against the torch installed now."""
    ext_dir = extensions_dir()
    if ext_dir is None:
        return False
    marker = ext_dir / ".ortlab-built-for"
    have_all = all(any(ext_dir.glob(f"{name}*.so")) for name in EXTENSIONS)
    # Extensions built by hand (ORT's own installer) have no marker: trust them, the probe will tell.
    return have_all and (not marker.exists() or marker.read_text() == _built_for())


def build_extensions(force: bool = False) -> bool:
    """Compile ORTModule's two CPU extensions into the installed onnxruntime package.

    Returns False when there was nothing to do. Takes about 3 minutes on 2 cores; needs a C++ compiler. A build
    for the same torch, ORT, Python, compiler and sources is copied from ortlab's cache instead
    (`ortlab.accel.ort_buildcache`; `force` compiles anyway). A marker records the torch they were built against, so
    a torch upgrade triggers a rebuild.
    """
    ext_dir = extensions_dir()
    if ext_dir is None or package_version("onnxruntime-training") is None:
        raise RuntimeError(f"onnxruntime-training is not installed: {INSTALL_HINT}")
    if extensions_built() and not force:
        return False
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError("building ORTModule's extensions needs a C++ compiler: install g++ (apt-get install g++)")
    from ortlab.accel import ort_buildcache

    entry = ort_buildcache.key(ext_dir, _built_for(), EXTENSIONS)
    if not force and ort_buildcache.restore(ext_dir, entry, EXTENSIONS):
        print(f"[ortlab] ORTModule extensions: copied from ortlab's cache ({entry[:12]}), not compiled", flush=True)
        (ext_dir / ".ortlab-built-for").write_text(_built_for())
        return True
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 2))
    fresh: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="ortlab-ort-ext-") as tmp:
        for i, name in enumerate(EXTENSIONS, 1):
            print(f"[ortlab] building ORTModule extension {i}/{len(EXTENSIONS)}: {name}", flush=True)
            build = Path(tmp) / name
            setup_py = ext_dir / "cpu" / name / "setup.py"
            cmd = [sys.executable, str(setup_py), "-q", "build", "--build-base", str(build)]
            # The compiler's output is long and only useful when it fails: keep it, show its tail then.
            proc = subprocess.run(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                tail = "\n".join(proc.stdout.splitlines()[-30:])
                raise RuntimeError(f"building ORTModule extension {name} failed ({' '.join(cmd)}):\n{tail}")
            built = list(build.glob("lib.*/*.so"))
            if not built:
                raise RuntimeError(f"building ORTModule extension {name} produced no .so under {build}")
            for so in built:
                shutil.copy2(so, ext_dir / so.name)
                fresh.append(ext_dir / so.name)
    (ext_dir / ".ortlab-built-for").write_text(_built_for())
    ort_buildcache.store(fresh, entry)
    return True


def _version_tuple(v: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(v).release


@lru_cache(maxsize=2)
def availability(probe: bool = False) -> Availability:
    """Can ORTModule train here? Static checks first (versions, extensions); `probe=True` also trains a tiny
    model through ORTModule with fallback disabled, which is the only way to know for sure. Run probes in a
    subprocess (the doctor does): a broken build can crash the interpreter."""
    name = "ort"
    py = sys.version_info[:2]
    if py > MAX_PYTHON:
        return Availability(
            name,
            False,
            f"Python {py[0]}.{py[1]}: onnxruntime-training 1.19.2 (the last release) has wheels up to Python 3.11",
            "run ORT training in a Python 3.11 runtime (ortlab can launch runs in another Python environment)",
        )
    ort_version = package_version("onnxruntime-training")
    if ort_version is None:
        inference_only = package_version("onnxruntime")
        why = "onnxruntime-training is not installed"
        if inference_only:
            why += f" (onnxruntime {inference_only} is, but it is inference-only)"
        return Availability(name, False, why, INSTALL_HINT)
    torch_version = package_version("torch")
    if torch_version is None:
        return Availability(name, False, "torch is not installed", "pip install 'torch==2.6.0'")
    if _version_tuple(torch_version)[:2] >= MAX_TORCH:
        return Availability(
            name,
            False,
            f"torch {torch_version}: onnxruntime-training {ort_version}'s interop extension needs torch < 2.7 "
            "(torch 2.7 stopped exporting symbols it links against)",
            "use torch 2.6.0 for ORT runs (a separate runtime: `pip install torch==2.6.0 'ortlab[ort]'`)",
        )
    if not extensions_built():
        return Availability(
            name,
            False,
            f"ORTModule's C++ extensions are not built (or were built for another torch) in {extensions_dir()}",
            "run `ortlab build-ort-extensions` (about 3 minutes; needs g++)",
        )
    details = {"onnxruntime_training": ort_version, "torch": torch_version}
    if probe:
        ok, message, probe_details = _probe()
        details.update(probe_details)
        if not ok:
            return Availability(
                name,
                False,
                f"ORTModule failed a tiny training step: {message}",
                _probe_remedy(),
                details=details,
            )
    device = "CUDA" if details.get("device") == "cuda" else "CPU"
    return Availability(
        name,
        True,
        f"onnxruntime-training {ort_version} with torch {torch_version}, extensions built"
        + (f"; a tiny model trained through ORTModule on {device}" if probe else NOT_PROBED),
        "on CPU, ORT is usually slower than eager PyTorch: its gains are GPU results; compare with the benchmark",
        details=details,
    )


def _probe_remedy() -> str:
    return "rebuild the extensions (`ortlab build-ort-extensions`) and check `ortlab doctor` in a fresh shell"


def _probe() -> tuple[bool, str, dict]:
    """Train one step of a tiny MLP through ORTModule with fallback disabled."""
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    try:
        import torch
        from onnxruntime.training.ortmodule import ORTModule

        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
        ort_model = ORTModule(model)
        x = torch.randn(4, 8, device=device)
        loss = ort_model(x).square().mean()
        loss.backward()
        grads_ok = all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        if not grads_ok:
            return False, "gradients missing or not finite", {"device": device}
        return True, "", {"device": device}
    except Exception as e:  # any failure is the answer: report it, do not crash the doctor
        return (
            False,
            f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}",
            {},
        )
    finally:
        os.environ.pop("ORTMODULE_FALLBACK_POLICY", None)


if __name__ == "__main__":
    # `python -m ortlab.accel.ort build-extensions` is what scripts/dev runs; `ortlab build-ort-extensions` too.
    if sys.argv[1:] == ["build-extensions"]:
        print("[ortlab] ORTModule extensions: " + ("ready" if build_extensions() else "already built"))
    else:
        print("usage: python -m ortlab.accel.ort build-extensions", file=sys.stderr)
        sys.exit(2)
