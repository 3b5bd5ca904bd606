"""Every run checks its prediction: the estimate made before it, against what it measured, into result.json.

`before_run` estimates the spec as the run starts (never failing the run: None when it cannot be estimated);
`after_run` compares it with the run's summary (peak memory, steady step time, wall time) and records what the
run taught into this machine's calibration (`ortlab.estimator.calibration`), so the next estimate here uses it.
Only a one-process run with steady steps teaches (a run of several processes measures rank 0 only), and not when
ORTLAB_ESTIMATE_RECORD=0 (the estimate benchmark's own rows must not calibrate the estimator they test).
"""

from __future__ import annotations

import os
from typing import Any

from ortlab.accel import tcmalloc
from ortlab.estimator import Estimate, calibration, estimate

RECORD_ENV = "ORTLAB_ESTIMATE_RECORD"


def before_run(spec: Any) -> Estimate | None:
    """The estimate of `spec` on this machine for this process, or None (a model whose config is not here, say): a
    run never fails for want of a prediction. On a CPU its peak RSS follows the allocator this process has."""
    try:
        return estimate(spec, allocator="tcmalloc" if tcmalloc.loaded() else "glibc")
    except Exception:
        return None


def after_run(est: Estimate | None, spec: Any, result: dict[str, Any], world_size: int = 1) -> dict[str, Any] | None:
    """Predicted against measured for result.json ("estimate"), and the calibration recorded; None without an
    estimate."""
    if est is None:
        return None
    summary = result.get("summary") or {}
    peak, step, wall = summary.get("peak_mem_mb"), summary.get("steady_step_time_s"), result.get("wall_time_s")
    if summary.get("mem_kind") == "cpu_peak_rss" and est.device != "cpu":
        try:  # the driver shows a GPU but the run trained on the CPU (a CPU build of torch): compare like with like
            est = estimate(spec, device="cpu", allocator=est.model.get("allocator"))
        except Exception:
            return None
    out = est.compared(peak, step, wall)  # what was predicted before the run, as it was
    teaches = world_size == 1 and bool(step) and os.environ.get(RECORD_ENV, "1") != "0"
    ran = ran_precision(result)
    if ran is not None and ran != est.precision:
        # 'auto' chose otherwise than the estimate assumed: learn against the precision the run trained in, so the
        # efficiency goes under its own key (against the bf16 peak, not fp32's)
        out["precision"] = {"predicted": est.precision, "ran": ran}
        try:
            as_ran = spec.model_copy(update={"accel": spec.accel.model_copy(update={"precision": ran})})
            est = estimate(as_ran, est.device, allocator=est.model.get("allocator"))
        except Exception:
            return {**out, "learned": {}, "recorded": False}
    before = result.get("eval_before")
    eval_s = before.get("eval_runtime") if isinstance(before, dict) else None  # (transformers' own timing)
    eval_s = float(eval_s) if isinstance(eval_s, (int, float)) and not isinstance(eval_s, bool) else None
    learned = est.learned(peak, step, wall, eval_s)
    out["learned"] = learned
    out["recorded"] = bool(teaches and calibration.record(est.model["calibration_key"], learned))
    if teaches and spec.accel.precision == "auto" and est.device == "cpu" and ran in ("fp32", "bf16"):
        calibration.record(calibration.auto_key(spec.model.name), {"auto_bf16": float(ran == "bf16")})
    return out


def ran_precision(result: dict[str, Any]) -> str | None:
    """The precision a run's matmuls trained in, by what it reports applied (bf16, fp16, else fp32)."""
    applied = result.get("accelerations")
    if not isinstance(applied, dict):
        return None
    for name in ("bf16", "fp16"):
        record = applied.get(name)
        if isinstance(record, dict) and record.get("applied") is True:
            return name
    return "fp32"
