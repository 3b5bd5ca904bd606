"""Wrapping a model in ORTModule, and knowing whether it really ran in ONNX Runtime.

`prepare_model` makes a transformers model exportable, `wrap` puts it in ORTModule with ortlab's options and CPU
session settings, and the rest reads ORTModule's state afterwards: whether it fell back to PyTorch and why
(`fallback_reason`, kept even when ORT forgets it), whether ONNX Runtime built a training session (`ran_in_ort`),
and how to send it to PyTorch on purpose (`force_fallback`, when the forward cannot be captured: ort_capture.py).
Whether ORTModule can run here at all is `ortlab.accel.ort.availability` (ort.py); everything here is re-exported there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.accel.ort_capture import ForwardNotCapturable
from ortlab.envvars import temporary_env
from ortlab.errors import OrtlabError

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
# read when the session is built). Measured in benchmarks/ort_cpu_study.py, docs/decisions/ort-and-runtimes.md
# "ORT on CPU":
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


def force_fallback(ort_module, reason: str) -> None:
    """Make ORTModule run the user's model in PyTorch from now on, before it exports anything.

    Uses ORTModule's own fallback path (a pending fallback is checked first thing in its forward), so DeepSpeed,
    DDP or anything else around the ORTModule keeps working unchanged; `fallback_reason` then reports `reason`.
    """
    manager = ort_module._fallback_manager
    manager._exception = ForwardNotCapturable(reason)
    manager._raised_fallback_exception = True  # ORT's own "report this to microsoft/onnxruntime" line would mislead
    manager.retry = False


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
