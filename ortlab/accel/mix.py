"""Which acceleration mixes can run in this Python environment: the rules of `ortlab.mixrules` that hold on
every machine, plus the ones that depend on this one. All of them are reached through `problems` here.

`ORTTrainingArguments` and in-process training call `validate` before any model loads, and each broken rule
says what to change. (A launched run is checked by its launcher against the target's doctor instead, which
reports the same `availability()` results, taken in that target.) Availability comes from the same `availability()`
functions that `ortlab doctor` shows, so the doctor and the trainer never disagree.
"""

from __future__ import annotations

from typing import Any

from ortlab import runtimes
from ortlab.accel import Availability, availability_of, fused_adam, precision, tcmalloc, torch_compile
from ortlab.mixrules import Mix, MixError, mix_from, rule_problems
from ortlab.toggles import TOGGLES

__all__ = ["Mix", "MixError", "mix_from", "mix_of", "problems", "resolve", "rule_problems", "runtime_for", "validate"]

# The accelerations whose rule is written out in `problems` below, instead of the plain one every other toggle gets
# ("requested, so it must be available here"): what they need depends on more than their availability (a CUDA
# device, the process's start, another runtime).
OWN_RULES = ("fp16", "bf16", "tf32", "tcmalloc", "torch_compile")


def _unavailable(a: Availability) -> str:
    return f"{a.name} was requested but is not available: {a.reason}. Fix: {a.remedy}"


def problems(mix: Mix, launched: bool = False) -> tuple[list[str], list[str]]:
    """(errors, warnings) for `mix` in this Python environment. Cheap: no probes, no model.

    `launched`: the mix describes a run that ortlab launches in its own process (a RunSpec), which may go to
    another of ortlab's runtimes (`runtime_for`); in-process training (`ORTTrainingArguments`) cannot.
    """

    # Combinations that can never work, wherever they run (the spec refuses them too).
    errors: list[str] = rule_problems(mix)
    warnings: list[str] = []

    if mix.lora:
        from ortlab.adapters import AdapterError, check_installed

        try:
            check_installed()
        except AdapterError as e:
            errors.append(str(e))

    # What this environment can run (static checks, the same the doctor starts with).
    cuda = _cuda_available() and not mix.use_cpu
    if mix.precision == "fp16" and not cuda:
        errors.append(
            "fp16 needs a CUDA device"
            + (" (use_cpu=True was set)" if mix.use_cpu and _cuda_available() else " and none is visible")
            + ": use precision 'bf16' or 'fp32' on this machine"
        )
    if mix.precision == "bf16":
        bf16 = precision.bf16_availability()
        if not bf16.available:
            errors.append(_unavailable(bf16))
        elif bf16.slow and not cuda:
            warnings.append(f"bf16: {bf16.reason}. {bf16.remedy}")
        if mix.ort and not cuda:
            # Seen: "Could not find an implementation for Gemm(13)" once the model had loaded (an EPYC with
            # avx512_bf16, where the precision probe found bf16 faster and chose it under ORT).
            errors.append(
                "ort with bf16 on a CPU: ONNX Runtime's CPU kernels have no bf16 matmul (Gemm). Fix: precision "
                "'fp32' (or 'auto') with ort, or ort false (or 'auto') with bf16"
            )
    if mix.tf32:
        tf32 = precision.tf32_availability()
        if not tf32.available or not cuda:
            why = tf32.reason if not tf32.available else "use_cpu=True was set"
            errors.append(f"tf32 was requested but cannot apply: {why}. Fix: set tf32 to 'auto' or false here")
    if mix.tcmalloc and tcmalloc.loaded() is None:
        errors.append(
            "tcmalloc was requested but this process did not start with it (an allocator is chosen when a process "
            "starts). Fix: launch the run (ortlab.launch(spec), `ortlab train`): ortlab starts its training process "
            "with tcmalloc where it is installed; or set tcmalloc to 'auto' or false here"
        )
    requested = mix.requested()
    for t in TOGGLES:
        if requested[t.name] and t.name not in OWN_RULES and not (a := availability_of(t)).available:
            errors.append(_unavailable(a))
    if mix.torch_compile and (problem := _compile_problem(launched)):
        errors.append(problem)
    return errors, warnings


def runtime_for(mix: Mix) -> str | None:
    """The ortlab runtime (`ortlab.runtimes`) a launched run of `mix` trains in, or None for this one.

    torch_compile in the ORT runtime (torch 2.6) goes to the compile runtime; everything else stays here. ORT +
    torch_compile is refused by `problems`, so a run never needs both runtimes at once.
    """

    if mix.torch_compile and not mix.ort and torch_compile.availability().details.get("needs_newer_torch"):
        return "compile"
    return None


def _compile_problem(launched: bool) -> str | None:

    a = torch_compile.availability()
    if a.available:
        return None
    if not a.details.get("needs_newer_torch"):
        return _unavailable(a)
    python = runtimes.python_for("compile")
    if python is None:
        return _unavailable(a)  # its remedy: `ortlab runtime create compile`
    if launched:
        return None  # the run goes to the compile runtime, whose own doctor checks it at launch
    return (
        f"torch_compile cannot run in this process: {a.reason}. A launched run goes to the compile runtime by "
        f"itself (ortlab.launch(spec), `ortlab train`); or run this script with the compile runtime's Python, "
        f"{python}"
    )


def validate(mix: Mix, launched: bool = False) -> list[str]:
    """Raise `MixError` naming every broken rule; return the warnings (slow but valid choices)."""
    errors, warnings = problems(mix, launched)
    if errors:
        raise MixError(errors)
    return warnings


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(accel: Any, choice: dict[str, Any] | None = None) -> Any:
    """`accel` (an AccelSpec) with 'auto' replaced by `choice` (measured, `ortlab.tune`) where it has a value, else
    by this machine's conservative default: what measurements showed never loses to plain PyTorch. No ORT (0.7-0.9x
    eager on a 2-core CPU); fp32 on a CPU (bf16 is 0.8x or 1.6x depending on the CPU) and 16 bits on a CUDA device
    (bf16 on Ampere and newer, fp16 on Volta and Turing: `precision.cuda_default_precision`); fused AdamW where
    available (1.0x on one CPU, 1.2x on another, faster on CUDA; the same update up to rounding); TF32 where the GPU
    has it; tcmalloc where this process started with it (its launcher decided: `ortlab.accel.tcmalloc`)."""

    default = {"ort": False, "precision": precision.cuda_precision_default() or "fp32"}
    if accel.fused_adam == "auto" and "fused_adam" not in (choice or {}):
        default["fused_adam"] = fused_adam.availability().available
    if accel.tf32 == "auto" and "tf32" not in (choice or {}):
        default["tf32"] = precision.tf32_availability().available  # static: a CUDA device of compute capability >= 8.0
    if accel.tcmalloc == "auto" and "tcmalloc" not in (choice or {}):
        default["tcmalloc"] = tcmalloc.loaded() is not None
    return accel.resolved({**default, **(choice or {})})


def mix_of(spec: Any, choice: dict[str, Any] | None = None) -> Mix:
    """The mix a run of `spec` (a RunSpec) trains with in this environment ('auto' resolved by `resolve`)."""
    a = resolve(spec.accel, choice)
    return mix_from(a.model_dump(), processes=spec.target.processes, lora=spec.adapter.kind == "lora")
