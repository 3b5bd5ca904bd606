"""One number of an estimate: its value, its range and what it rests on."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# What a number rests on, from firmest to softest.
FORMULA = "formula"  # arithmetic on the model's sizes (exact where the sizes are: weights, optimizer state)
MEASURED = "measured here"  # a measurement on this machine (the matmul peak, a calibration from runs here)
CALIBRATED = "calibrated"  # a constant measured on this project's machines, before any run here
ASSUMED = "assumed"  # a default with nothing measured behind it (the range says how unsure)
BASES = (FORMULA, MEASURED, CALIBRATED, ASSUMED)


@dataclass(frozen=True)
class Term:
    """A part of the estimate: memory in MiB, or time in seconds."""

    name: str
    value: float
    low: float
    high: float
    basis: str  # one of BASES
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def term(name: str, value: float, spread: float, basis: str, note: str = "") -> Term:
    """A term whose range is `value` +/- `spread` (a share: 0.1 = 10 %)."""
    return Term(name, value, value * (1 - spread), value * (1 + spread), basis, note)


def total(name: str, terms: list[Term], basis: str | None = None, note: str = "") -> Term:
    """The sum of `terms`; its basis is the softest of theirs unless given (a sum is as firm as its weakest part)."""
    if basis is None:
        basis = max((t.basis for t in terms), key=lambda b: BASES.index(b) if b in BASES else len(BASES))
    return Term(name, sum(t.value for t in terms), sum(t.low for t in terms), sum(t.high for t in terms), basis, note)
