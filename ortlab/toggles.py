"""The accelerations, defined once: one record each (what varies for it), which everything else iterates.

A toggle carries its name, its label in a form, the spec field it sets (with the values that mean on and off), where
its availability is checked (`availability`: a function of its `ortlab.accel` module, named by path because this
layer cannot import that one; `ortlab.accel.availability_of` resolves it), which probe subprocess answers for it
(`probe_group`), the `TrainingArguments` it sets (`arguments`; a whole mix's: `mix_arguments`, read back from them:
`field_values_from`), whether a measurement may decide it (`tuned`), and whether the forms draw it. A tracker records
its field's resolved value (`ortlab.trackers.run_config`). The spec's `Mix` is built from the fields' values in one
place (`ortlab.mixrules.mix_from`); the doctor, the workbench, the trackers, the command line's options and the
guide's table iterate `TOGGLES`, and `tests/test_toggles.py` fails when a toggle lacks any part.

An acceleration has one name everywhere: the doctor reports by it, a run's record of what was requested and what
applied is keyed by it (`Mix.requested`), and the workbench and the JupyterLab sidebar draw a checkbox for it that
writes one field of the spec's `accel` section. Those were four copies that had to agree (`Mix.requested`, the
workbench's toggle list and its form, the sidebar's TOGGLES/accelFor), and had drifted: the workbench showed
bare names where the sidebar showed labels, let fp16 and bf16 both be ticked (fp16 won) while the sidebar kept
them exclusive (and made bf16 win). Now the workbench reads `TOGGLES` here, the sidebar reads the same list
from the server's `GET ortlab/api/spec` (`specfields.form`), and a test holds every field to the spec's schema.

Toggles that set the same field exclude each other (a field holds one value): fp16 and bf16 both set
`precision`, so ticking one unticks the other, in every form. It lives below the spec (standard library only), so
`mixrules.Mix.requested` can read it without reaching up a layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SECTION = "accel"  # every toggle sets a field of the spec's `accel` section (AccelSpec; Mix has the same names)


@dataclass(frozen=True)
class Toggle:
    """One acceleration as a checkbox: ticked, its AccelSpec `field` is `on`; with no toggle of that field ticked
    the field is `off`. `also_on` are other values of the field that mean this acceleration too (ZeRO stages 2
    and 3 need what stage 1 needs, DeepSpeed, and a run records any stage as "zero1")."""

    name: str
    label: str
    field: str
    on: Any
    off: Any
    # "module" or "module:function" (function default `availability`): what says whether it can run here, with its
    # reason and remedy (an `ortlab.accel.Availability`); resolved by `ortlab.accel.availability_of`.
    availability: str
    # The doctor's probe subprocess that answers for it (`ortlab.probe.groups`): the accelerations that need torch
    # share one (importing torch once); one that may crash the interpreter (ORT) or load a library has its own.
    probe_group: str
    # The TrainingArguments it sets: `argument` is `argument_on` when the toggle is on, `argument_off` when not (a
    # toggle with `passes_value` passes its field's value instead: ZeRO's stage). `argument_also` are other
    # (argument, value) pairs that mean it is on, read back from arguments a user wrote (`field_values_from`).
    argument: str
    argument_on: Any = True
    argument_off: Any = False
    argument_also: tuple[tuple[str, Any], ...] = ()
    passes_value: bool = False
    also_on: tuple[Any, ...] = ()
    # Whether a measurement (`ortlab.tune`, the workbench's "measure the fastest") decides its field when it is 'auto'.
    tuned: bool = False
    # Whether the forms draw it. tf32 and tcmalloc are left to their 'auto' (on where the machine has them): no form
    # offers them.
    in_forms: bool = True

    @property
    def path(self) -> str:
        """The field's dotted path in a spec ("accel.precision")."""
        return f"{SECTION}.{self.field}"

    def is_on(self, value: Any) -> bool:
        """Whether the field's value means this acceleration is asked for. The value must be resolved (no 'auto'):
        a `Mix`'s, or an AccelSpec's after `ortlab.accel.mix.resolve`."""
        return value == self.on or value in self.also_on

    @property
    def flag(self) -> bool:
        """Whether its field is a switch (on is True): the command line offers `--x/--no-x` for it."""
        return self.on is True

    def arguments(self, value: Any) -> dict[str, Any]:
        """The TrainingArguments its field's resolved `value` sets."""
        if self.passes_value:
            return {self.argument: value}
        return {self.argument: self.argument_on if self.is_on(value) else self.argument_off}

    def on_in(self, arguments: Any) -> bool:
        """Whether TrainingArguments (an object with them as attributes) ask for this acceleration."""
        pairs = ((self.argument, self.argument_on), *self.argument_also)
        return any(_plain(getattr(arguments, name, None)) == want for name, want in pairs)

    def to_dict(self) -> dict[str, Any]:
        """As the server sends it to the sidebar (JSON)."""
        return {"name": self.name, "label": self.label, "path": self.path, "on": self.on, "off": self.off}


def _plain(value: Any) -> Any:
    """An enum's value (transformers' `OptimizerNames`), else the value itself."""
    return getattr(value, "value", value)


_ACCEL = "ortlab.accel."

# In the order the forms draw them (and the doctor lists them).
TOGGLES: tuple[Toggle, ...] = (
    Toggle(
        "ort", "ONNX Runtime (ORTModule)", "ort", True, False,
        availability=_ACCEL + "ort", probe_group="ort", argument="use_ort", tuned=True,
    ),
    Toggle(
        "fused_adam", "fused AdamW", "fused_adam", True, False,
        availability=_ACCEL + "fused_adam", probe_group="torch",
        # Optimum's name: ORTTrainingArguments turns it into its own `fused_adam` and torch's fused optim name.
        argument="optim", argument_on="adamw_ort_fused", argument_off="adamw_torch",
        argument_also=(("fused_adam", True), ("optim", "adamw_torch_fused")),
        tuned=True,
    ),
    Toggle(
        "zero1", "DeepSpeed ZeRO-1", "zero_stage", 1, 0, also_on=(2, 3),
        availability=_ACCEL + "zero", probe_group="zero1", argument="zero_stage", passes_value=True,
    ),
    Toggle(
        "bf16", "bf16", "precision", "bf16", "fp32",
        availability=_ACCEL + "precision:bf16_availability", probe_group="torch", argument="bf16", tuned=True,
    ),
    Toggle(
        "fp16", "fp16", "precision", "fp16", "fp32",
        availability=_ACCEL + "precision:fp16_availability", probe_group="torch", argument="fp16", tuned=True,
    ),
    # Explicit either way in the arguments: left at None, transformers turns TF32 on by itself for torch_compile runs.
    Toggle(
        "tf32", "TF32 matmuls", "tf32", True, False, in_forms=False,
        availability=_ACCEL + "precision:tf32_availability", probe_group="torch", argument="tf32",
    ),
    Toggle(
        "torch_compile", "torch.compile", "torch_compile", True, False,
        availability=_ACCEL + "torch_compile", probe_group="torch", argument="torch_compile",
    ),
    # A process's allocator, chosen when it starts: left to its 'auto' (on where the library is installed).
    Toggle(
        "tcmalloc", "tcmalloc allocator", "tcmalloc", True, False, in_forms=False,
        availability=_ACCEL + "tcmalloc", probe_group="tcmalloc", argument="tcmalloc",
    ),
)  # fmt: skip
NAMES: tuple[str, ...] = tuple(t.name for t in TOGGLES)
# The spec fields the toggles set, each once, in order (fp16 and bf16 share `precision`).
FIELDS: tuple[str, ...] = tuple(dict.fromkeys(t.field for t in TOGGLES))
# The fields a measurement decides when they are 'auto'.
TUNED_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(t.field for t in TOGGLES if t.tuned))


def form_toggles() -> tuple[Toggle, ...]:
    """The toggles a form draws, in order."""
    return tuple(t for t in TOGGLES if t.in_forms)


def toggle(name: str) -> Toggle:
    for t in TOGGLES:
        if t.name == name:
            return t
    raise KeyError(f"no acceleration toggle named {name!r} (known: {', '.join(NAMES)})")


def exclusive_with(name: str) -> tuple[str, ...]:
    """The toggles that ticking `name` unticks: the others that set the same field."""
    field = toggle(name).field
    return tuple(t.name for t in TOGGLES if t.field == field and t.name != name)


def requested(values: Any) -> dict[str, bool]:
    """Which accelerations an object with the fields' names as attributes (a `Mix`, a resolved AccelSpec) asks
    for, by name: the run record's `requested`."""
    return {t.name: t.is_on(getattr(values, t.field)) for t in TOGGLES}


def field_values(ticked: Iterable[str]) -> dict[str, Any]:
    """The spec fields, by dotted path, that the form toggles say when the toggles named in `ticked` are ticked:
    each field the `on` of its first ticked toggle, else its `off`. (The forms keep a field's toggles exclusive, so
    "first" only decides for a caller that ticks two.)"""
    ticked = set(ticked)
    values: dict[str, Any] = {}
    for t in form_toggles():
        if t.name in ticked and t.path not in values:
            values[t.path] = t.on
    for t in form_toggles():
        values.setdefault(t.path, t.off)
    return values


def off_value(field: str) -> Any:
    """The value of `field` when none of its toggles is on."""
    return next(t.off for t in TOGGLES if t.field == field)


def mix_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments that resolved field values (by field name; no 'auto') set. A field missing from `values`
    sets nothing (a tune candidate names only the fields it varies)."""
    arguments: dict[str, Any] = {}
    for t in TOGGLES:
        if t.field in values:
            arguments.update(t.arguments(values[t.field]))
    return arguments


def field_values_from(arguments: Any) -> dict[str, Any]:
    """The field values that TrainingArguments (an object with them as attributes) ask for: the reverse of
    `mix_arguments`. A field takes the `on` of its first toggle that is on in them, else its `off`."""
    values: dict[str, Any] = {}
    for t in TOGGLES:
        if t.passes_value:
            values[t.field] = getattr(arguments, t.argument)
        elif t.field not in values and t.on_in(arguments):
            values[t.field] = t.on
    return {f: values.get(f, off_value(f)) for f in FIELDS}
