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

from ortlab.estimator import Estimate, calibration, estimate

RECORD_ENV = "ORTLAB_ESTIMATE_RECORD"


def before_run(spec: Any) -> Estimate | None:
    """The estimate of `spec` on this machine, or None (a model whose config is not here, say): a run never fails
    for want of a prediction."""
    try:
        return estimate(spec)
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
            est = estimate(spec, device="cpu")
        except Exception:
            return None
    out = est.compared(peak, step, wall)
    learned = est.learned(peak, step, wall)
    out["learned"] = learned
    teaches = world_size == 1 and bool(step) and os.environ.get(RECORD_ENV, "1") != "0"
    out["recorded"] = bool(teaches and calibration.record(est.model["calibration_key"], learned))
    return out
