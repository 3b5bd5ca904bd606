"""What a measurement found: one `Measured` row per candidate mix and the `TuneResult` around them.

Stdlib only, so that a face (the workbench reads `ortlab tune --json` into a `TuneResult`) can hold a result
without importing torch; the cache stores and reads this shape.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ortlab.errors import OrtlabError


class TuneError(OrtlabError, RuntimeError):
    """The measurement could not be made (the plain baseline itself failed); says why."""


@dataclass
class Measured:
    """What one candidate measured, and its verdict."""

    name: str
    choice: dict[str, Any]
    samples_per_s: float | None = None  # median over the slices
    ratio: float | None = None  # median of the paired ratios to plain
    ratio_min: float | None = None
    ratio_max: float | None = None
    warmup_s: float | None = None
    peak_mem_mb: float | None = None
    mem_kind: str | None = None
    loss: float | None = None  # mean training loss over the measured steps
    applied: dict[str, bool] = field(default_factory=dict)
    verdict: str = ""  # "chosen", or why it lost / was not measured
    slices: list[float] = field(default_factory=list)
    # Beside plain transformers.Trainer measured in the same rounds (`ortlab tune` only; see ortlab.tune.share):
    vs_trainer: float | None = None  # median paired ratio to Trainer in fp32
    vs_trainer_bf16: float | None = None  # ... and to Trainer with bf16=True
    peak_pct: float | None = None  # model FLOP/s over the measured matmul peak of the precision it trains in


@dataclass
class TuneResult:
    chosen: str
    choice: dict[str, Any]
    candidates: list[Measured]
    rounds: int
    slice_steps: int
    calibration_s: float
    key: str
    environment: dict[str, Any]
    shapes: dict[str, Any]
    cached: bool = False
    created: float = field(default_factory=time.time)
    references: list[Measured] = field(default_factory=list)  # plain Trainer, fp32 and bf16 (never chosen)
    peaks: dict[str, Any] = field(default_factory=dict)  # the measured peak per precision the shares use
    flops_per_sample: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuneResult:
        d = dict(d)
        d["candidates"] = [Measured(**m) for m in d["candidates"]]
        d["references"] = [Measured(**m) for m in d.get("references", [])]
        return cls(**d)

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate, for terminals, notebooks and model cards."""
        return [
            {
                "mix": m.name,
                "samples/s": m.samples_per_s,
                "vs plain": m.ratio,
                "spread": (m.ratio_min, m.ratio_max) if m.ratio_min is not None else None,
                "warm-up s": m.warmup_s,
                "peak MB": m.peak_mem_mb,
                "vs Trainer": m.vs_trainer,
                "vs Trainer bf16": m.vs_trainer_bf16,
                "% of peak": m.peak_pct,
                "verdict": m.verdict,
            }
            for m in [*self.candidates, *self.references]
        ]
