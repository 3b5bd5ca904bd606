"""Launch and resume for the server: the same `ortlab.runner` calls every face makes, run off the event loop.

A spec parses without torch (it validates only itself), and a launch checks it against its target's doctor,
whose answer is cached and whose probes run in their own processes. So the server launches in one of its worker
threads, in its own process, and the run's worker starts in its own session (it outlives the server). Relative
paths in a spec mean what they mean in the file browser: the run starts in the server's root folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.runner import attach, launch


def launch_in(root: Path, spec: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """Launch `spec` under the runs root `root`: {"id", "path"}. SpecError or RunError say why not."""
    run = launch(spec, root=root, cwd=cwd)
    return {"id": run.id, "path": str(run.path)}


def estimate_in(spec: dict[str, Any], device: Any, price: Any, cwd: Path) -> dict[str, Any]:
    """The estimate of `spec` (`ortlab.estimator`), its relative paths read from the server's root folder as a
    launch reads them, with its table: SpecError, EstimateError or BudgetError say why not.

    As the workbench's note does, the estimate is the one Launch would start from (`estimator.budget.as_launched`:
    with a budget, of the spec fitted to it, with what the fit changes in `fitted`; a named `device` with a budget
    is refused). `refusal`: when Launch would refuse the run here (`ortlab.estimator.fits.refused`), its message
    with the remedies, else null."""
    from ortlab.estimator import EstimateError
    from ortlab.estimator.budget import as_launched
    from ortlab.estimator.fits import refusal, refused
    from ortlab.spec import RunSpec

    if device is not None and not isinstance(device, str):
        raise EstimateError("device: a device name (cpu, T4, A100 80GB, H100 SXM, ...)")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0):
        raise EstimateError("price_per_hour: a number, zero or more")
    launched = as_launched(RunSpec.parse(spec).anchored(cwd), device=device, price_per_hour=price)
    est = launched.estimate
    why = refusal(launched.spec, est, device) if refused(est) else None
    return {**est.to_dict(), "table": est.table(), "fitted": launched.choices, "refusal": why}


def resume_in(root: Path, run_id: str, cwd: Path) -> dict[str, Any]:
    """Resume the run `run_id` under `root`: {"id", "state"}. RunError or SpecError say why not."""
    run = attach(run_id, root=root).resume(cwd=str(cwd))
    return {"id": run.id, "state": run.dir.read_status().get("state")}
