"""The acceleration mix, and every rule about which mixes can run. All of them live here, in one function.

A rule is checked before any model loads (the RunSpec, the CLI and `ORTTrainingArguments` all call
`validate`), and each broken rule says what to change. Availability comes from the same `check()` functions
that `ortlab doctor` shows, so the doctor and the trainer never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ortlab.accel import Availability
from ortlab.errors import OrtlabError

Precision = Literal["fp32", "fp16", "bf16"]


@dataclass(frozen=True)
class Mix:
    """What the user asked for. `processes` is the number of data-parallel training processes."""

    ort: bool = False
    fused_adam: bool = False
    zero_stage: int = 0
    precision: Precision = "fp32"
    torch_compile: bool = False
    tf32: bool = False
    processes: int = 1
    use_cpu: bool = False
    # A DeepSpeed config the user supplied defines its own optimizer (so ortlab's optimizer choice is moot).
    deepspeed_defines_optimizer: bool = False
    # LoRA adapters (ortlab.adapters): not an acceleration (it changes what trains) but it meets all of them.
    lora: bool = False

    def requested(self) -> dict[str, bool]:
        return {
            "ort": self.ort,
            "fused_adam": self.fused_adam,
            "zero1": self.zero_stage > 0,
            "fp16": self.precision == "fp16",
            "bf16": self.precision == "bf16",
            "tf32": self.tf32,
            "torch_compile": self.torch_compile,
        }


class MixError(OrtlabError, ValueError):
    """An acceleration mix that cannot run here. `problems` lists each broken rule with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"this acceleration mix cannot run here:\n{lines}")


def _unavailable(a: Availability) -> str:
    return f"{a.name} was requested but is not available: {a.reason}. Fix: {a.remedy}"


def problems(mix: Mix, launched: bool = False) -> tuple[list[str], list[str]]:
    """(errors, warnings) for `mix` in this Python environment. Cheap: no probes, no model.

    `launched`: the mix describes a run that ortlab launches in its own process (a RunSpec), which may go to
    another of ortlab's runtimes (`runtime_for`); in-process training (`ORTTrainingArguments`) cannot.
    """
    from ortlab.accel import fused_adam, ort, precision, zero

    errors: list[str] = []
    warnings: list[str] = []

    if mix.processes < 1:
        errors.append(f"processes must be >= 1 (got {mix.processes})")
    if mix.zero_stage not in (0, 1, 2, 3):
        errors.append(f"zero_stage must be 0, 1, 2 or 3 (got {mix.zero_stage})")

    # Combinations that can never work, wherever they run.
    if mix.ort and mix.torch_compile:
        errors.append(
            "ort and torch_compile both take over the model's graph (ONNX Runtime or Inductor): pick one "
            "(set torch_compile=False to train with ORT, or use_ort=False to compile)"
        )
    if mix.ort and mix.zero_stage == 3:
        errors.append(
            "ort cannot run with ZeRO stage 3: stage 3 partitions the parameters, which ORTModule's ONNX export "
            "must see whole. Use zero_stage=1 (or 2) with ORT, or turn ORT off for stage 3"
        )
    if mix.fused_adam and mix.deepspeed_defines_optimizer:
        errors.append(
            "the DeepSpeed config defines its own optimizer, so optim='adamw_ort_fused' would be ignored: remove "
            "the 'optimizer' section from the DeepSpeed config, or choose another optim"
        )

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
        bf16 = precision.check_bf16()
        if not bf16.available:
            errors.append(_unavailable(bf16))
        elif bf16.slow and not cuda:
            warnings.append(f"bf16: {bf16.reason}. {bf16.remedy}")
    if mix.tf32:
        tf32 = precision.check_tf32()
        if not tf32.available or not cuda:
            why = tf32.reason if not tf32.available else "use_cpu=True was set"
            errors.append(f"tf32 was requested but cannot apply: {why}. Fix: set tf32 to 'auto' or false here")
    requested_checks = (
        (mix.ort, ort.check),
        (mix.fused_adam, fused_adam.check),
        (mix.zero_stage > 0, zero.check),
    )
    for requested, check in requested_checks:
        if requested and not (a := check()).available:
            errors.append(_unavailable(a))
    if mix.torch_compile and (problem := _compile_problem(launched)):
        errors.append(problem)
    return errors, warnings


def runtime_for(mix: Mix) -> str | None:
    """The ortlab runtime (`ortlab.runtimes`) a launched run of `mix` trains in, or None for this one.

    torch_compile in the ORT runtime (torch 2.6) goes to the compile runtime; everything else stays here. ORT +
    torch_compile is refused by `problems`, so a run never needs both runtimes at once.
    """
    from ortlab.accel import torch_compile

    if mix.torch_compile and not mix.ort and torch_compile.check().details.get("needs_newer_torch"):
        return "compile"
    return None


def _compile_problem(launched: bool) -> str | None:
    from ortlab import runtimes
    from ortlab.accel import torch_compile

    a = torch_compile.check()
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
