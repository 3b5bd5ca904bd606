"""No cluster run hangs or loops for ever (issue #32 item 4), on the session's real two-node local cluster.

A job the cluster cannot place, a Ray Train group that cannot start, and a deterministic error that every restart
repeats each end the run `failed` with the reason, within a bound; a stop reaches a job in every state; the Ray
command ortlab prints works as printed. The runs are started past the launch's check (`start` on a claimed folder),
as if the cluster had lost what the check saw: that is the situation being tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ortlab import cluster
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run, launcher_for
from ortlab.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("ray-cluster")]


def started(spec: dict) -> Run:
    """A run started on its launcher without the launch's check (the cluster changed after it)."""
    parsed = RunSpec.parse(spec)
    run = Run(RunDir.create(parsed.output_dir, parsed).path)
    run._process = launcher_for(parsed).start(run.dir, parsed)
    return run


def ended(run: Run, timeout: float) -> dict:
    status = run.wait(timeout=timeout)
    return {**status, "log": run.dir.log_path.read_text()[-3000:]}


def test_a_job_the_cluster_cannot_place_is_stopped_in_every_way(ray_head, remote_spec):
    # Asks for a GPU the cluster does not have: Ray Jobs keeps it PENDING for ever.
    gpu = {"gpus_per_process": 1}

    # 1. The bound: target.start_timeout_s, then `failed` saying what it asked for.
    run = started(remote_spec("unplaced", start_timeout_s=3, **gpu))
    status = ended(run, timeout=90)
    assert status["state"] == "failed", status
    assert "could not start the job within target.start_timeout_s (3 s)" in status["error"], status
    assert "1 GPU(s)" in status["error"]

    # 2. A stop asked for while the job waits (Run.stop, the sidebar's Stop): the job is stopped at once.
    run = started(remote_spec("stopped-waiting", **gpu))
    while run.state == "pending" and "job_id" not in (run.status().get("launcher") or {}):
        time.sleep(0.2)
    began = time.monotonic()
    status = run.stop(timeout=60)
    assert status["state"] == "stopped", status
    assert time.monotonic() - began < 30, "the stop did not wait for the job's start"

    # 3. The Ray commands ortlab prints work as printed on the local head (its address and token file included).
    run = started(remote_spec("stopped-by-hand", **gpu))
    while "job_id" not in (run.status().get("launcher") or {}):
        time.sleep(0.2)
    job = run.status()["launcher"]["job_id"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for args, says in ((("job", "status", job), "PENDING"), (("job", "stop", job, "--no-wait"), job)):
        command = cluster.ray_command("local", *args)
        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and says in done.stdout + done.stderr, (command, done.stdout, done.stderr)
    assert run.stop(timeout=60)["state"] == "stopped"


def test_a_ray_train_group_that_cannot_start_ends_the_run_with_the_reason(ray_head, remote_spec):
    run = started(remote_spec("train-unplaced", processes=2, gpus_per_process=1, start_timeout_s=3))
    status = ended(run, timeout=180)
    assert status["state"] == "failed", status
    assert "could not place 2 Ray Train worker(s) of 1 CPU, 1 GPU each" in status["error"], status
    assert "free on the cluster now" in status["error"]


def test_a_deterministic_error_is_not_restarted_again_and_again(ray_head, remote_spec, tmp_path):
    spec = remote_spec("missing-model", processes=2, max_failures=50)
    spec["model"]["name"] = str(tmp_path / "no-such-model")
    run = started(spec)
    status = ended(run, timeout=400)
    assert status["state"] == "failed", status
    assert "failed twice in a row with the same error and trained no step in between" in status["error"], status
    assert "no-such-model" in status["error"]
