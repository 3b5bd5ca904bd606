"""Gates for tests on live runs: hold a run at a known step instead of hoping the machine is fast or slow."""

from __future__ import annotations

import time
from typing import Any


def launch_gated(spec: Any, at_step: int):
    """Launch `spec` (a RunSpec or its dict) as a run that holds once `at_step` steps are done.

    The gate (`Run.pause(at_step=...)`) is set before the run's process starts, so the run is there, running,
    whatever the machine's speed.
    """
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run, _start
    from ortlab.spec import RunSpec

    spec = spec if isinstance(spec, RunSpec) else RunSpec.parse(spec)
    run = Run(RunDir.create(spec.output_dir, spec).path)
    run.pause(at_step=at_step)
    run._process = _start(run.dir, spec)
    return run


def wait_paused(run: Any, timeout: float = 300) -> None:
    """Return once the run waits at its gate; fail with its status and log if it ends or never gets there."""
    deadline = time.monotonic() + timeout
    while not run.status().get("paused"):
        assert run.state in ("pending", "running"), (run.status(), run.dir.log_path.read_text()[-3000:])
        assert time.monotonic() < deadline, f"the run never reached its gate: {run.status()}"
        time.sleep(0.2)
