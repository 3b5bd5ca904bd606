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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ortlab.accel import NOT_PROBED, Availability, package_version
from ortlab.envvars import temporary_env
from ortlab.errors import OrtlabError

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

    Returns False when there was nothing to do. Takes about 3 minutes on 2 cores; needs a C++ compiler.
    A marker records the torch they were built against, so a torch upgrade triggers a rebuild.
    """
    ext_dir = extensions_dir()
    if ext_dir is None or package_version("onnxruntime-training") is None:
        raise RuntimeError(f"onnxruntime-training is not installed: {INSTALL_HINT}")
    if extensions_built() and not force:
        return False
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError("building ORTModule's extensions needs a C++ compiler: install g++ (apt-get install g++)")
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 2))
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
    (ext_dir / ".ortlab-built-for").write_text(_built_for())
    return True


def _version_tuple(v: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(v).release


@lru_cache(maxsize=2)
def check(probe: bool = False) -> Availability:
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


# --- applying it ---------------------------------------------------------------------------------------------

LOG_LEVELS = ("VERBOSE", "INFO", "WARNING", "ERROR", "FATAL")


@dataclass(frozen=True)
class ORTOptions:
    """ORTModule's useful knobs. `fallback="error"` makes an export failure fail the run instead of silently
    training in PyTorch; `save_onnx_path` keeps the exported training graphs (for Netron or for a bug report);
    `memory_opt_level` 1 recomputes layer activations in backward (less memory, more compute)."""

    log_level: str = "WARNING"
    save_onnx_path: str | None = None
    memory_opt_level: int = 0
    fallback: str = "warn"
    onnx_prefix: str = "ortlab"

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"ort_log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.fallback not in ("warn", "error"):
            raise ValueError(f"ort_fallback must be 'warn' or 'error', got {self.fallback!r}")
        if self.memory_opt_level not in (0, 1, 2):
            raise ValueError(f"ort_memory_opt_level must be 0, 1 or 2, got {self.memory_opt_level!r}")


class ORTFallbackError(OrtlabError, RuntimeError):
    """ORTModule could not run the model and `ort_fallback="error"` was set."""


def prepare_model(model) -> dict[str, str]:
    """Make a transformers-5 model exportable by ORTModule; return what was changed.

    - attention: SDPA (the transformers default) breaks ORT 1.19's gradient builder; eager attention exports.
    - use_cache: a decoder's KV cache is a `Cache` object, not tensors: the ONNX export cannot return it.
    """
    changed: dict[str, str] = {}
    config = getattr(model, "config", None)
    if config is None:
        return changed
    attn = getattr(config, "_attn_implementation", None)
    if attn not in (None, "eager") and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
        changed["attention"] = f"eager (was {attn})"
    # Encoder-decoder models (T5) give their decoder stack a copy of the config, read when use_cache is not passed.
    configs = {id(config): config}
    for module in model.modules():
        sub = getattr(module, "config", None)
        if sub is not None and hasattr(sub, "use_cache"):
            configs.setdefault(id(sub), sub)
    if any(getattr(c, "use_cache", False) for c in configs.values()):
        for c in configs.values():
            if getattr(c, "use_cache", False):
                c.use_cache = False
        changed["use_cache"] = "False (a KV cache cannot be exported)"
    return changed


def wrap(model, options: ORTOptions):
    """Wrap `model` in ORTModule. The wrapper shares the model's parameters: an optimizer built on the model
    trains through it, and the model itself stays a plain PyTorch/transformers model (for saving)."""
    env = {"ORTMODULE_MEMORY_OPT_LEVEL": str(options.memory_opt_level)}
    if options.fallback == "error":
        env["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    with temporary_env(env):
        from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

        debug = DebugOptions(
            log_level=LogLevel[options.log_level],
            save_onnx=bool(options.save_onnx_path),
            onnx_prefix=options.onnx_prefix,
            save_path=options.save_onnx_path or "",
        )
        if options.save_onnx_path:
            Path(options.save_onnx_path).mkdir(parents=True, exist_ok=True)
        module = ORTModule(model, debug)
    _record_fallbacks(module)
    configure_session(module, CPU_SESSION)
    return module


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ONNX Runtime session settings ortlab applies when ORTModule runs on a CPU (see configure_session; a callable is
# read when the session is built). Measured in benchmarks/ort_cpu_study.py, docs/decisions.md "ORT on CPU":
# - intra_op_num_threads: ORT's pool otherwise takes one thread per physical core whatever torch was told
#   (torch.set_num_threads, OMP_NUM_THREADS), so ORT and eager PyTorch would not train on the same thread
#   budget; now they do. On a 2-core machine both are 2: no speed change there, by construction.
# - allow_spinning 0: ORT's idle pool threads sleep instead of busy-waiting, so they do not take the cores from
#   torch's own threads (the optimizer step, autograd) and from the other processes of a shared machine.
#   Measured 1.40x ORT as it was (median of 10 paired rounds, faster in 7; 95 % interval 0.89-1.89 on a
#   machine whose noise floor was 0.94-1.26): not worse, not resolved as better.
# Neither changes what is computed: per-step losses equal eager's to 1.2e-7 (dropout off; the study's --parity).
CPU_SESSION: dict[str, Any] = {
    "intra_op_num_threads": _torch_threads,
    "session.intra_op.allow_spinning": "0",
}


def configure_session(ort_module, settings: dict[str, Any]) -> None:
    """Apply `settings` to the ONNX Runtime sessions ORTModule builds for a CPU device (training and inference).

    ORTModule builds its `SessionOptions` itself (`GraphExecutionManager._get_session_config`) and offers no way
    to pass any: ortlab wraps that method on this module's two managers. Keys are `SessionOptions` attributes
    (`intra_op_num_threads`, `enable_mem_reuse`, ...) or, with a dot in the name, session config entries
    (`session.intra_op.allow_spinning`). What was applied is kept on the module as `_ortlab_session`.
    """
    from onnxruntime.training.ortmodule._torch_module_ort import TorchModuleORT

    ort_module._ortlab_session = {}
    if not settings or not isinstance(ort_module._torch_module, TorchModuleORT):
        return
    factory = ort_module._torch_module._execution_manager
    for manager in (factory(True), factory(False)):
        manager._get_session_config = _session_config(manager, manager._get_session_config, settings, ort_module)


def _session_config(manager, original, settings: dict[str, Any], ort_module):
    def get_session_config():
        session_options, providers, provider_options = original()
        if manager._device.type == "cpu":
            applied = {key: value() if callable(value) else value for key, value in settings.items()}
            for key, value in applied.items():
                if "." in key:
                    session_options.add_session_config_entry(key, str(value))
                else:
                    setattr(session_options, key, value)
            ort_module._ortlab_session = applied
        return session_options, providers, provider_options

    return get_session_config


def _record_fallbacks(ort_module) -> None:
    """Keep every fallback's reason on the module, whatever ORT does with its own record afterwards.

    With ORTMODULE_FALLBACK_RETRY set, ORTModule forgets a fallback once the PyTorch step ran (and tries ONNX
    Runtime again next step), so reading its state after the first step would miss steps trained in PyTorch.
    """
    manager = ort_module._fallback_manager
    seen: list[str] = []
    original = manager.fallback

    def fallback(*args, **kwargs):
        if manager._exception is not None:
            seen.append(describe_error(manager._exception))
        return original(*args, **kwargs)

    manager.fallback = fallback
    ort_module._ortlab_fallbacks = seen


MAX_ERROR_CHARS = 4000


def describe_error(e: BaseException) -> str:
    """`Type: message` with the whole message (up to MAX_ERROR_CHARS): ORT's first line is often only "There was
    an error while exporting the PyTorch model to ONNX:", and what failed (the operator) comes after it."""
    text = str(e).strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + " [...]"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def unsupported_operator(text: str) -> str | None:
    """The operator an ONNX export failed on (`aten::diff`), if the error names one."""
    import re

    match = re.search(r"operator '?([a-z_]+::[A-Za-z0-9_.]+)'?", text) or re.search(r"\b(aten::[A-Za-z0-9_.]+)", text)
    return match.group(1) if match else None


def fallback_reason(ort_module) -> str | None:
    """Why ORTModule is running the model in PyTorch instead of ONNX Runtime (the whole error), or None."""
    from onnxruntime.training.ortmodule._torch_module_pytorch import TorchModulePytorch

    manager = ort_module._fallback_manager
    if manager._exception is not None:
        return describe_error(manager._exception)
    seen = getattr(ort_module, "_ortlab_fallbacks", [])
    if seen:
        return (
            f"{seen[0]}\n(ORTModule retried ONNX Runtime afterwards, ORTMODULE_FALLBACK_RETRY: {len(seen)} "
            "forward(s) ran in PyTorch)"
        )
    if isinstance(ort_module._torch_module, TorchModulePytorch):
        return "ORTModule switched to PyTorch at initialisation"
    return None


class ForwardNotCapturable(Exception):
    """The model's forward does Python things an exported graph cannot repeat (see python_effects_of_forward)."""


def force_fallback(ort_module, reason: str) -> None:
    """Make ORTModule run the user's model in PyTorch from now on, before it exports anything.

    Uses ORTModule's own fallback path (a pending fallback is checked first thing in its forward), so DeepSpeed,
    DDP or anything else around the ORTModule keeps working unchanged; `fallback_reason` then reports `reason`.
    """
    manager = ort_module._fallback_manager
    manager._exception = ForwardNotCapturable(reason)
    manager._raised_fallback_exception = True  # ORT's own "report this to microsoft/onnxruntime" line would mislead
    manager.retry = False


_SIMPLE = (int, float, bool, str, bytes, type(None))


def _attribute_state(model) -> dict[tuple[str, str], tuple]:
    """Plain Python attributes of every submodule (counters, flags, lists): how they look now, to compare and
    to restore. Tensors, submodules and nn.Module's own bookkeeping are left out (buffers are compared apart)."""
    import torch

    # nn.Module's bookkeeping, and transformers' record of the warnings it gave once (not model state)
    internal = set(vars(torch.nn.Module())) | {"training", "warnings_issued"}
    state = {}
    for prefix, module in model.named_modules():
        for key, value in vars(module).items():
            if key in internal or key.startswith("__"):
                continue
            if isinstance(value, _SIMPLE):
                state[(prefix, key)] = (value, value, None)
            elif isinstance(value, (list, dict, set)):
                # identity, and a shallow copy of the contents: an append or a new list both show
                copy = type(value)(value) if type(value) in (list, dict, set) else value.copy()
                state[(prefix, key)] = (value, copy, len(value))
    return state


def _changed(before: tuple, after: tuple | None) -> bool:
    if after is None:
        return True
    obj, contents, _ = before
    new_obj, new_contents, _ = after
    if isinstance(obj, _SIMPLE):
        return type(obj) is not type(new_obj) or obj != new_obj
    if obj is not new_obj:
        return True
    if isinstance(contents, list):
        if len(contents) != len(new_contents):
            return True
        return any(a is not b for a, b in zip(contents, new_contents, strict=True))
    if isinstance(contents, dict):
        return contents.keys() != new_contents.keys() or any(contents[k] is not new_contents[k] for k in contents)
    return contents != new_contents


def python_effects_of_forward(model, inputs: dict) -> list[str]:
    """Run `model(**inputs)` once in eager PyTorch (no gradients) and say what it did that a graph cannot redo.

    ORTModule exports `forward` by tracing it: whatever the Python code does besides tensor operations happens
    while exporting and never again (seen: a buffer meant to record every step recorded two entries; a
    `random.random()` draw became a constant, so the loss stopped varying). Looked for: buffers re-assigned or
    changed in place, plain Python attributes changed (counters, lists), and draws from Python's `random` or
    NumPy's global generator. torch's own random ops (dropout, torch.rand) are graph ops and are fine.

    Everything is put back afterwards (buffers, attributes, and the torch, CUDA, Python and NumPy random
    states), so the training that follows runs exactly as if this check had not happened.
    """
    import random

    import numpy as np
    import torch

    torch_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py_state = random.getstate()
    np_state = np.random.get_state()
    buffers = {name: (b, b.detach().clone()) for name, b in model.named_buffers()}
    attributes = _attribute_state(model)
    was_training = model.training
    problems: list[str] = []
    try:
        model.train()
        with torch.no_grad():
            model(**inputs)
        if random.getstate() != py_state:
            problems.append("draws random numbers with Python's `random` module")
        after_np = np.random.get_state()
        if after_np[0] != np_state[0] or after_np[2] != np_state[2] or not np.array_equal(after_np[1], np_state[1]):
            problems.append("draws random numbers with NumPy's global generator (np.random)")
        now = dict(model.named_buffers())
        for name, (tensor, value) in buffers.items():
            current = now.get(name)
            if current is None or current is not tensor:
                problems.append(f"re-assigns the buffer `{name}`")
            elif current.shape != value.shape or not torch.equal(current.detach(), value):
                problems.append(f"changes the buffer `{name}` in place")
        for name in now.keys() - buffers.keys():
            problems.append(f"registers the buffer `{name}`")
        after = _attribute_state(model)
        for (prefix, key), before in attributes.items():
            if _changed(before, after.get((prefix, key))):
                problems.append(f"changes the attribute `{(prefix + '.' if prefix else '') + key}`")
    finally:
        # put everything back
        modules = dict(model.named_modules())
        for name, (tensor, value) in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = modules[owner]
            with torch.no_grad():
                if tensor.shape == value.shape:
                    tensor.copy_(value)
            module._buffers[leaf] = tensor
        for (prefix, key), (obj, contents, _) in attributes.items():
            module = modules[prefix]
            if isinstance(contents, list):
                obj[:] = contents
            elif isinstance(contents, (dict, set)):
                obj.clear()
                obj.update(contents)
            vars(module)[key] = obj
        torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        random.setstate(py_state)
        np.random.set_state(np_state)
        model.train(was_training)
    return problems


def ran_in_ort(ort_module) -> bool:
    """True once ONNX Runtime has built a training session for the model (after the first training forward)."""
    from onnxruntime.training.ortmodule._torch_module_ort import TorchModuleORT

    torch_module = ort_module._torch_module
    if not isinstance(torch_module, TorchModuleORT):
        return False
    return torch_module._execution_manager(True)._execution_agent is not None


def is_ort_error(exc: BaseException) -> bool:
    """An exception raised by ORTModule (export, graph build or execution)."""
    return type(exc).__module__.startswith("onnxruntime")


if __name__ == "__main__":
    # `python -m ortlab.accel.ort build-extensions` is what scripts/dev runs; `ortlab build-ort-extensions` too.
    if sys.argv[1:] == ["build-extensions"]:
        print("[ortlab] ORTModule extensions: " + ("built" if build_extensions() else "already built"))
    else:
        print("usage: python -m ortlab.accel.ort build-extensions", file=sys.stderr)
        sys.exit(2)
