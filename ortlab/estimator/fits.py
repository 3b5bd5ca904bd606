"""Refuse what cannot fit, before loading: the numbers, the biggest term, and the remedies ranked by effect.

A run whose predicted peak memory is above what the device has fails late and badly: on a GPU an out-of-memory
error after the model and data have loaded (minutes in), on a CPU the kernel's OOM killer or a machine swapping to
a halt. `check(spec)` runs in the launch's preflight (`ortlab.runner.preflight`), before any run folder or model
exists, and raises `DoesNotFit` when even the low end of the prediction's range is above the device's memory: a
confident refusal (a run the estimate is unsure about goes ahead). Each remedy is the spec changed one way and
estimated again (the data's sample is tokenized once: `lengths` caches it), ranked by the memory it saves:
smaller batch with gradient accumulation (the same effective batch), a shorter max_length, gradient checkpointing,
LoRA, ZeRO-1 across the run's processes, bf16 (on a GPU: on a CPU without bf16 units it is 10x slower).
ORTLAB_ESTIMATE_CHECK=0 skips the check (an estimate can be wrong; the user has the last word).
"""

from __future__ import annotations

import os
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.estimator import Estimate, EstimateError, as_spec, estimate

CHECK_ENV = "ORTLAB_ESTIMATE_CHECK"


class DoesNotFit(OrtlabError, ValueError):
    """The run's predicted peak memory is above what the device has; the message has the numbers and remedies."""


def _changed(spec: Any, section: str, **values: Any) -> Any:
    part = getattr(spec, section)
    return spec.model_copy(update={section: part.model_copy(update=values)})


def remedies(spec: Any, est: Estimate, device: str | None = None) -> list[tuple[str, Estimate]]:
    """(what to change, the estimate with that change), each alone, most memory saved first."""
    hyper, options = spec.hyper, []
    if hyper.batch_size > 1:
        batch = hyper.batch_size
        while batch > 1:  # the largest batch that fits, else 1
            batch //= 2
            tried = estimate(_changed(spec, "hyper", batch_size=batch), device=device)
            if tried.fits:
                break
        accum = hyper.gradient_accumulation_steps * max(1, hyper.batch_size // batch)
        options.append(
            (
                f"hyper.batch_size: {batch} with gradient_accumulation_steps: {accum} (the same effective batch)",
                _changed(spec, "hyper", batch_size=batch, gradient_accumulation_steps=accum),
            )
        )
    if est.seq_peak > 32:
        shorter = max(32, est.seq_peak // 2)
        options.append(
            (f"hyper.max_length: {shorter} (rows are cut there)", _changed(spec, "hyper", max_length=shorter))
        )
    if not hyper.gradient_checkpointing and spec.accel.ort is not True:
        options.append(("hyper.gradient_checkpointing: true", _changed(spec, "hyper", gradient_checkpointing=True)))
    if spec.adapter.kind != "lora":
        options.append(
            ("adapter.kind: lora (train an adapter, not every weight)", _changed(spec, "adapter", kind="lora"))
        )
    if spec.target.processes > 1 and spec.accel.zero_stage == 0:
        options.append(("accel.zero_stage: 1 (shard the optimizer state)", _changed(spec, "accel", zero_stage=1)))
    if est.device != "cpu" and est.precision == "fp32":
        options.append(("accel.precision: bf16", _changed(spec, "accel", precision="bf16")))
    out = []
    for text, changed in options:
        try:
            out.append((text, estimate(changed, device=device)))
        except Exception:  # a change the spec's own rules refuse (checkpointing with ORT...) is no remedy
            continue
    return sorted(out, key=lambda pair: pair[1].peak.value)


def refusal(spec: Any, est: Estimate, device: str | None = None) -> str:
    """The message of a run that does not fit: the numbers, the biggest term, the remedies ranked."""
    assert est.available_mb is not None
    big = est.biggest
    lines = [
        f"this run needs about {est.peak.value:,.0f} MiB per process ({est.peak.low:,.0f}-{est.peak.high:,.0f}) on "
        f"{est.device}, which has {est.available_mb:,.0f} MiB available; the biggest term is {big.name}: "
        f"{big.value:,.0f} MiB ({big.note}). It would fail after loading the model. Remedies, most effective first:"
    ]
    for text, after in remedies(spec, est, device):
        verdict = "fits" if after.fits else "still too big"
        lines.append(f"  - {text}: {after.peak.value:,.0f} MiB ({verdict})")
    lines.append(f"(`ortlab estimate` shows every term; {CHECK_ENV}=0 skips this check)")
    return "\n".join(lines)


def refused(est: Estimate) -> bool:
    """Would the launch refuse this estimate's run? When even the low end of its predicted peak is above what the
    device has (a confident refusal: a run the estimate is unsure about goes ahead)."""
    return est.available_mb is not None and est.peak.low > est.available_mb


def check(spec: Any, device: str | None = None) -> Estimate | None:
    """Raise DoesNotFit when `spec` cannot fit on this machine (the low end of its predicted peak is above the
    device's memory); returns the estimate, or None when there is none (a model whose config is not here)."""
    if os.environ.get(CHECK_ENV, "1") == "0":
        return None
    spec = as_spec(spec)
    try:
        est = estimate(spec, device=device)
    except EstimateError:
        return None
    except Exception:  # an estimator's bug must never stop a launch: the run's own checks still apply
        return None
    if refused(est):
        raise DoesNotFit(refusal(spec, est, device))
    return est
