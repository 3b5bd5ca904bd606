"""The acceleration toggles, defined once: each one's name, its label in a form, and the spec field it sets.

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

from collections.abc import Iterable
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
    also_on: tuple[Any, ...] = ()
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

    def to_dict(self) -> dict[str, Any]:
        """As the server sends it to the sidebar (JSON)."""
        return {"name": self.name, "label": self.label, "path": self.path, "on": self.on, "off": self.off}


# In the order the forms draw them (and the doctor lists them).
TOGGLES: tuple[Toggle, ...] = (
    Toggle("ort", "ONNX Runtime (ORTModule)", "ort", True, False),
    Toggle("fused_adam", "fused AdamW", "fused_adam", True, False),
    Toggle("zero1", "DeepSpeed ZeRO-1", "zero_stage", 1, 0, also_on=(2, 3)),
    Toggle("bf16", "bf16", "precision", "bf16", "fp32"),
    Toggle("fp16", "fp16", "precision", "fp16", "fp32"),
    Toggle("tf32", "TF32 matmuls", "tf32", True, False, in_forms=False),
    Toggle("torch_compile", "torch.compile", "torch_compile", True, False),
    # A process's allocator, chosen when it starts: left to its 'auto' (on where the library is installed).
    Toggle("tcmalloc", "tcmalloc allocator", "tcmalloc", True, False, in_forms=False),
)
NAMES: tuple[str, ...] = tuple(t.name for t in TOGGLES)


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
