"""A run fitted to a budget: memory in GB, time in minutes; what was chosen and why, or the closest budget that fits.

`fit_budget(spec, minutes=15)` or `fit_budget(spec, memory_gb=8)` (or both) changes the spec as little as it can,
in an order that keeps what the run learns: for memory, gradient checkpointing first (the same training, a third
slower), then a smaller batch with gradient accumulation (the same effective batch, slower steps), then a shorter
max_length (rows are cut: the one change that alters what is learned, last); for time, the number of steps (the
run stops early: `hyper.max_steps`), after the memory changes, whose cost in time it counts. When nothing fits it
raises `BudgetError` naming the closest budget that would (the most reduced run's peak memory; the time of the
startup, the evaluations and one step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.estimator import Estimate, EstimateError, as_spec, estimate

MIN_LENGTH = 32


class BudgetError(OrtlabError, ValueError):
    """No run of this spec fits the budget; the message names the closest budget that does."""


@dataclass
class Budgeted:
    spec: Any  # the fitted RunSpec
    estimate: Estimate
    choices: list[str] = field(default_factory=list)  # what was changed, and why


def fit_spec_budget(spec: Any) -> Budgeted:
    """`spec` fitted to its own `budget` section, with `choices` never empty (what changed, or that nothing had to),
    as the launch writes it into `budget.fitted` and the workbench's note shows it. A cluster run has no budget: the
    estimate is this machine's, and the cluster's workers are other machines."""
    spec = as_spec(spec)
    if spec.target.cluster:
        raise BudgetError(
            "budget: a run is fitted to a budget from this machine's estimate, and the cluster's workers are other "
            "machines; remove budget, and set hyper.max_steps and hyper.batch_size for the cluster yourself"
        )
    fitted = fit_budget(spec, minutes=spec.budget.minutes, memory_gb=spec.budget.memory_gb)
    if not fitted.choices:
        est = fitted.estimate
        minutes = f", {est.total.value / 60:.1f} min" if est.total is not None else ""
        fitted.choices = [f"nothing changed: the estimate ({est.peak.value * 2**20 / 1e9:.2f} GB{minutes}) fits"]
    return fitted


def as_launched(spec: Any, device: str | None = None, price_per_hour: float | None = None) -> Budgeted:
    """The spec and estimate Launch would start from, for the faces that show it before Launch (the workbench's
    note, the server's `POST estimate`): with a budget, the spec fitted to it (`fit_spec_budget`, the launch's own
    fit) and what changed; without one, the spec as it is and no choices. A budget is fitted to this machine, so
    a named `device` with one is refused; a price is estimated on the fitted spec."""
    spec = as_spec(spec)
    if not spec.budget.asked:
        return Budgeted(spec, estimate(spec, device=device, price_per_hour=price_per_hour))
    if device is not None:
        raise EstimateError("device: a budget is fitted to this machine's estimate; leave device out with a budget")
    fitted = fit_spec_budget(spec)
    if price_per_hour is not None:  # (the fit's own estimates carry no cost: the fitted spec once more, ~0.1 s)
        fitted.estimate = estimate(fitted.spec, price_per_hour=price_per_hour)
    return fitted


def _with(spec: Any, **hyper: Any) -> Any:
    return spec.model_copy(update={"hyper": spec.hyper.model_copy(update=hyper)})


def fit_budget(
    spec: Any, minutes: float | None = None, memory_gb: float | None = None, device: str | None = None
) -> Budgeted:
    """`spec` changed to fit `memory_gb` of peak memory per process and `minutes` of wall time (see the module)."""
    spec = as_spec(spec)
    est = estimate(spec, device=device)
    choices: list[str] = []
    if memory_gb is not None:
        limit = memory_gb * 1e9 / 2**20
        if est.peak.value > limit and not spec.hyper.gradient_checkpointing and spec.accel.ort is not True:
            spec = _with(spec, gradient_checkpointing=True)
            est = estimate(spec, device=device)
            choices.append(f"gradient checkpointing on: activations {est.term('activations').value:,.0f} MiB")
        asked = spec.hyper.batch_size
        while est.peak.value > limit and spec.hyper.batch_size > 1:
            batch = spec.hyper.batch_size // 2
            accum = spec.hyper.gradient_accumulation_steps * spec.hyper.batch_size // batch
            spec = _with(spec, batch_size=batch, gradient_accumulation_steps=accum)
            est = estimate(spec, device=device)
        if spec.hyper.batch_size != asked:
            choices.append(
                f"batch {spec.hyper.batch_size} x {spec.hyper.gradient_accumulation_steps} accumulation (the same "
                f"effective batch as {asked}): peak {est.peak.value:,.0f} MiB"
            )
        longest = est.seq_peak
        while est.peak.value > limit and est.seq_peak > MIN_LENGTH:
            spec = _with(spec, max_length=max(MIN_LENGTH, est.seq_peak // 2))
            est = estimate(spec, device=device)
        if est.seq_peak != longest:
            choices.append(f"max_length {spec.hyper.max_length} (rows of up to {longest} tokens are cut)")
        if est.peak.value > limit:
            raise BudgetError(
                f"budget.memory_gb: no run of this spec fits {memory_gb:g} GB per process: the smallest (batch 1, "
                f"checkpointing, max_length {MIN_LENGTH}) needs {est.peak.value * 2**20 / 1e9:.2f} GB "
                f"({est.biggest.name} is its biggest term); ask for at least that, or a LoRA adapter"
            )
    if minutes is not None:
        if est.total is None:
            raise BudgetError(
                "budget.minutes: the run's length is not known (its data rows cannot be counted here); set "
                "hyper.max_steps and estimate again"
            )
        fixed = est.total.value - (est.steps or 0) * est.step.value
        room = minutes * 60 - fixed
        steps = math.floor(room / est.step.value) if room > 0 else 0
        if steps < 1:
            closest = (fixed + est.step.value) / 60
            raise BudgetError(
                f"budget.minutes: {minutes:g} minutes do not hold one step: startup and evaluations take "
                f"{fixed / 60:.1f} min and a step {est.step.value:.1f} s; the closest budget is {closest:.1f} minutes"
            )
        if est.steps is None or steps < est.steps:
            spec = _with(spec, max_steps=steps)
            est = estimate(spec, device=device)
            choices.append(
                f"max_steps {steps}: {est.step.value:.2f} s a step, {fixed / 60:.1f} min of startup and evaluations "
                f"in {minutes:g} min"
            )
    return Budgeted(spec, est, choices)
