"""The acceleration mix as a description (`Mix`), and the rules about it that hold on every machine.

Two kinds of rule decide whether a mix can run. Some hold wherever it runs: ORT and torch.compile both take over
the model's graph, ZeRO stage 3 hides the whole parameters ORTModule must export. Those are here, below the spec,
so that `RunSpec` refuses such a mix the moment it is written, on any machine, without importing torch. The
others depend on the machine (is there a CUDA device, is this ORT build there); they are in `ortlab.accel.mix`,
which adds them to these, and are checked where the run goes: by the launcher against the target's doctor, or
by `ORTTrainingArguments` in the training process itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ortlab.errors import OrtlabError
from ortlab.toggles import FIELDS, requested

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
    tcmalloc: bool = False
    processes: int = 1
    use_cpu: bool = False
    # A DeepSpeed config the user supplied defines its own optimizer (so ortlab's optimizer choice is moot).
    deepspeed_defines_optimizer: bool = False
    # LoRA adapters (ortlab.adapters): not an acceleration (it changes what trains) but it meets all of them.
    lora: bool = False

    def requested(self) -> dict[str, bool]:
        """Which accelerations this mix asks for, by the names the doctor and a run's record use
        (`ortlab.toggles`: ZeRO at any stage is "zero1", a precision is its own name)."""
        return requested(self)


def mix_from(values: Mapping[str, Any], **others: Any) -> Mix:
    """The one place a `Mix` is built from the toggles' field values (`values`, by field name: a spec's accel section
    with 'auto' decided, or what TrainingArguments ask for, `toggles.field_values_from`); `others` are the mix's
    fields that are not toggles (processes, use_cpu, lora, ...). A value the mix keeps as a switch is a bool."""
    fields = {f: bool(values[f]) if isinstance(getattr(Mix, f), bool) else values[f] for f in FIELDS}
    return Mix(**fields, **others)


class MixError(OrtlabError, ValueError):
    """An acceleration mix that cannot run here. `problems` lists each broken rule with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"this acceleration mix cannot run here:\n{lines}")


def rule_problems(mix: Mix) -> list[str]:
    """The broken rules of `mix` that no machine could fix, each with what to change."""
    errors: list[str] = []
    if mix.processes < 1:
        errors.append(f"processes must be >= 1 (got {mix.processes})")
    if mix.zero_stage not in (0, 1, 2, 3):
        errors.append(f"zero_stage must be 0, 1, 2 or 3 (got {mix.zero_stage})")
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
    if mix.zero_stage == 3 and mix.processes > 1:
        errors.append(
            "ZeRO stage 3 across several processes is not supported yet (it fails once the model has loaded, "
            "locally and on a cluster): use zero_stage=1 or 2 with several processes, or stage 3 in one process"
        )
    if mix.fused_adam and mix.deepspeed_defines_optimizer:
        errors.append(
            "the DeepSpeed config defines its own optimizer, so optim='adamw_ort_fused' would be ignored: remove "
            "the 'optimizer' section from the DeepSpeed config, or choose another optim"
        )
    return errors
