"""Run folders written by hand: valid for every reader (spec, status, metrics), with no training behind them.

For tests and benchmarks of views (the server, listings) that need many runs, or a "running" run whose metrics
the test appends itself. A `running` fake names the calling process as its worker, and that process holds the
run's log open (as an in-process run does: how readers tell a run's own process from a forged pid), so liveness
checks see it alive, and its own, for as long as the test runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# The logs held open by this process for its `running` fakes (closed when the process ends).
HELD: list[int] = []

ACCELERATIONS = {
    "ort": {"name": "ort", "requested": True, "applied": False, "details": {"fallback": "test"}},
    "fused_adam": {"name": "fused_adam", "requested": True, "applied": True, "details": {}},
    "bf16": {"name": "bf16", "requested": False, "applied": False, "details": {}},
}


def step_record(step: int, loss: float = 0.5, samples_per_s: float = 40.0) -> dict[str, Any]:
    return {
        "event": "step",
        "step": step,
        "epoch": step / 100,
        "loss": loss,
        "learning_rate": 1e-4,
        "step_time_s": 16 / samples_per_s,
        "samples": 16,
        "tokens": 16 * 128,
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * 128,
        "peak_mem_mb": 900.0,
        "mem_kind": "cpu_peak_rss",
        "time": time.time(),
    }


def append(path: Path, *records: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def make_fake_run(
    root: str | os.PathLike, name: str, state: str = "completed", steps: int = 20, max_steps: int = 100
) -> Path:
    """A run folder named `name` in `root`, in `state`, with `steps` step records (and a result if completed)."""
    from ortlab import safeio
    from ortlab.runfolder.processes import process_create_time
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec

    spec = RunSpec.parse(
        {"name": name, "output_dir": str(root), "hyper": {"max_steps": max_steps}, "accel": {"ort": True}}
    )
    run = RunDir.create(root, spec)
    pid = os.getpid()
    if state == "running":
        HELD.append(run.open_log())
    run.set_status("running", pid=pid, create_time=process_create_time(pid), step=0)
    append(
        run.metrics_path,
        {"event": "train_begin", "max_steps": max_steps, "world_size": 1, "accelerations": ACCELERATIONS},
        *[step_record(s, loss=1.0 / s) for s in range(1, steps + 1)],
    )
    if steps:
        append(run.metrics_path, {"event": "verified", "step": 1, "accelerations": ACCELERATIONS})
    if state == "completed":
        summary = {"steps": steps, "steady_samples_per_s": 41.5}
        append(
            run.metrics_path, {"event": "train_end", "step": steps, "summary": summary, "accelerations": ACCELERATIONS}
        )
        safeio.write_json(run.path, "result.json", {"summary": summary, "eval_after": {"eval_accuracy": 0.8}})
        run.set_status("completed", step=steps)
    elif state in ("stopped", "failed"):
        run.set_status(state, step=steps, **({"error": "RuntimeError: boom"} if state == "failed" else {}))
    elif state != "running":
        raise ValueError(f"make_fake_run: unsupported state {state!r}")
    return run.path


def cut_back(source: Path, dest: Path, step: int, last_checkpoint: int) -> Any:
    """A copy of the finished run folder `source` at `dest`, as it was when its step-`step` checkpoint was written:
    no model, no result, no checkpoint at `last_checkpoint`, the metrics through `step`; claimed by this process as
    `ortlab resume` claims a run (status pending, this pid). Returns its `RunDir`."""
    import shutil

    from ortlab.runfolder.processes import process_create_time
    from ortlab.runfolder.rundir import RunDir

    shutil.copytree(source, dest)
    for gone in ("model", "result.json", f"checkpoints/checkpoint-{last_checkpoint}"):
        shutil.rmtree(dest / gone) if (dest / gone).is_dir() else (dest / gone).unlink()
    kept = [json.loads(line) for line in (dest / "metrics.jsonl").read_text().splitlines()]
    (dest / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in kept if r.get("step", 0) <= step and r.get("event") != "train_end")
    )
    (dest / "status.json").unlink()
    run = RunDir(dest)
    run.set_status("pending", pid=os.getpid(), create_time=process_create_time(os.getpid()))
    return run
