"""Remote runs on a real Ray head: `ortlab cluster`, launch, live metrics, stop/resume, a killed worker, errors.

One Ray head for the whole module (started through `ortlab.cluster.start` on loopback with token auth, in its
own folder, stopped by its PID at the end). Every run is a real tiny-BERT training job submitted through Ray's
Jobs API and watched through its local run folder, exactly as a notebook would.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest
from gates import launch_gated, wait_paused

import ortlab
from ortlab import cluster
from ortlab.runner import RunError
from ortlab.runner.compare import row_for
from ortlab.runner.rundir import RunDir, process_alive

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    old = os.environ.get("ORTLAB_CLUSTER_DIR")
    os.environ["ORTLAB_CLUSTER_DIR"] = str(folder)  # the monitors started by the tests inherit it
    record = cluster.start(num_cpus=2)
    yield record
    cluster.stop()
    if old is None:
        os.environ.pop("ORTLAB_CLUSTER_DIR", None)
    else:
        os.environ["ORTLAB_CLUSTER_DIR"] = old


@pytest.fixture(scope="module")
def make_spec(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")

    def make(name: str, max_steps: int = 12, **target) -> dict:
        return {
            "name": name,
            "output_dir": str(root),
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 400, "max_eval_samples": 32},
            "hyper": {"learning_rate": 1e-3, "batch_size": 8, "max_length": 32, "max_steps": max_steps},
            "accel": {"ort": False, "fused_adam": False},
            "target": {"cluster": "local", **target},
        }

    return make


def steps_of(run) -> list[int]:
    return [r["step"] for r in run.metrics() if r["event"] == "step"]


def test_cluster_start_records_the_head_and_keeps_its_token_private(head):
    record = cluster.status()
    assert record["running"] and record["pid"] == head["pid"]
    assert head["address"].startswith("http://127.0.0.1:")
    mode = stat.S_IMODE(cluster.token_path().stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert cluster.start()["pid"] == head["pid"], "a second start returns the running head"


def test_a_remote_run_streams_live_completes_and_comes_home(head, make_spec, capfd):
    run = launch_gated(make_spec("live", max_steps=12), at_step=3)
    wait_paused(run, timeout=150)
    assert run.state == "running"
    assert steps_of(run) == [1, 2, 3], "the metrics arrive while the job runs"
    # A second handle (a restarted kernel) follows from the start, with nothing twice.
    other = ortlab.attach(run.id, root=run.path.parent)
    run.unpause()
    records = list(other.follow(timeout=150))
    assert run.wait(timeout=60)["state"] == "completed", run.status()
    assert [r["step"] for r in records if r["event"] == "step"] == list(range(1, 13))
    remote = RunDir(run.status()["launcher"]["storage"])
    assert run.metrics() == remote.metrics(), "the local stream is the remote one, in order, each record once"
    assert (run.path / "model" / "config.json").is_file() and run.result()["summary"]["steps"] == 12
    assert "accelerations" in run.result()
    assert row_for(run.dir).where == "cluster local", "`ortlab runs` says where it runs"
    report = run.export_onnx(samples=8, batch_sizes=(1,))
    assert report.good, report.to_dict()
    token = cluster.token_path().read_text().strip()
    out = capfd.readouterr()
    assert token not in out.out + out.err
    for folder in (run.path, remote.path):
        for path in folder.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), f"the token leaked into {path}"


def test_stop_resume_and_a_killed_worker(head, make_spec):
    """Two runs at once (the head offers 2 CPUs, each job asks for 1): one is stopped and resumed, the other's
    worker is killed."""
    run = launch_gated(make_spec("stop-resume", max_steps=8), at_step=3)
    doomed = launch_gated(make_spec("killed", max_steps=50), at_step=2)
    wait_paused(run, timeout=150)
    wait_paused(doomed, timeout=150)

    remote = RunDir(doomed.status()["launcher"]["storage"])
    os.kill(remote.read_status()["worker_pid"], signal.SIGKILL)

    status = run.stop(timeout=120)
    assert status["state"] == "stopped", status
    at = status["step"]
    assert at >= 3 and status["checkpoint"].endswith(f"checkpoint-{at}"), status
    assert run.dir.last_checkpoint().name == f"checkpoint-{at}", "the checkpoint comes home"
    run.resume()

    failed = doomed.wait(timeout=90)
    assert failed["state"] == "failed"
    assert "remote job ended without a result" in failed["error"], failed
    assert "exit code 137" in failed["error"] and "SIGKILL" in failed["error"], failed["error"]
    assert steps_of(doomed) == [1, 2], "every metric received is kept"

    assert run.wait(timeout=150)["state"] == "completed", run.status()
    assert steps_of(run) == list(range(1, 9)), "resumed where it stopped, nothing twice, nothing missing"


def test_an_unauthenticated_submission_is_refused(head, make_spec, monkeypatch, tmp_path):
    from ray.job_submission import JobSubmissionClient

    # Ray's own client, with no token: the head refuses it (this process has no RAY_AUTH_TOKEN).
    with pytest.raises(Exception, match=r"401|[Aa]uthentica"):
        JobSubmissionClient(head["address"]).submit_job(entrypoint="true")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-token")
    spec = make_spec("wrong-token", cluster=head["address"], storage=str(tmp_path / "storage"))
    spec["output_dir"] = str(tmp_path / "runs")
    with pytest.raises(RunError, match=r"authentication problem.*RAY_AUTH_TOKEN"):
        ortlab.launch(spec)
    assert not (tmp_path / "runs").exists(), "nothing is created before the cluster accepted us"


def test_clear_errors_before_anything_is_created(head, make_spec, tmp_path):
    def refused(match: str, **target) -> None:
        spec = make_spec("bad", **target)
        spec["output_dir"] = str(tmp_path / "runs")
        with pytest.raises(RunError, match=match):
            ortlab.launch(spec)
        assert not (tmp_path / "runs").exists()

    free = cluster._free_ports(1)[0]
    start = time.monotonic()
    refused(rf"http://127.0.0.1:{free} is unreachable", cluster=f"http://127.0.0.1:{free}", storage=str(tmp_path))
    assert time.monotonic() - start < 10
    refused(r"asks for 1 GPU\(s\), but the cluster at local has 0", gpus_per_process=1)
    # fp16 is not refused by this CPU laptop when the spec is parsed, but by the cluster's own doctor.
    spec = make_spec("fp16")
    spec["accel"]["precision"] = "fp16"
    spec["output_dir"] = str(tmp_path / "runs")
    with pytest.raises(RunError, match=r"cannot run on the cluster:\n.*fp16 is not available in the cluster local"):
        ortlab.launch(spec)


def test_cli_cluster_flag_and_status(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ortlab.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["train", "--cluster", "ftp://nowhere", "--output-dir", str(tmp_path)])
    assert out.exit_code == 2 and "target.cluster" in out.output and "http://127.0.0.1:8265" in out.output
    monkeypatch.setenv("ORTLAB_CLUSTER_DIR", str(tmp_path / "no-cluster"))
    out = runner.invoke(app, ["cluster", "status"])
    assert out.exit_code == 1 and "no local Ray head is running" in out.output
    out = runner.invoke(app, ["train", "--cluster", "local", "--output-dir", str(tmp_path / "runs")])
    assert out.exit_code == 2 and "ortlab cluster start" in out.output
    assert not (tmp_path / "runs").exists()


def test_ray_not_installed_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray.job_submission", None)
    with pytest.raises(cluster.ClusterError, match=r"pip install 'ortlab\[remote\]'"):
        cluster.connect("http://127.0.0.1:1")


def test_cluster_stop_ends_only_its_own_head(head):
    assert cluster.stop()
    assert not process_alive(head["pid"], head["create_time"])
    assert cluster.status()["running"] is False
    assert not cluster.stop(), "a second stop finds nothing to stop"
    assert json.loads(json.dumps(cluster.status()))["running"] is False
    assert not Path(head["temp_dir"]).exists()


def test_the_monitor_finds_a_tag_behind_another_writers_partial_line(tmp_path):
    """Seen in the benchmark: a progress bar's '\\r' line without a newline ran into a metric line of the job's log."""
    from ortlab.runner import remote

    (tmp_path / "logs").mkdir()
    (tmp_path / "status.json").write_text(json.dumps({"state": "running"}))
    monitor = remote.Monitor.__new__(remote.Monitor)
    monitor.run, monitor.have, monitor.final, monitor.buffer = RunDir(tmp_path), 0, None, ""
    monitor.log = (tmp_path / "logs" / "run.log").open("a")
    line = '{"seq": %d, "record": {"event": "step", "step": %d}}'
    monitor.feed("Writing model shards:   0%|  | 0/1\r" + remote.METRIC_TAG + line % (0, 1) + "\n")
    monitor.feed(remote.METRIC_TAG + line % (0, 1) + "\n" + remote.METRIC_TAG + (line % (1, 2))[:20])
    monitor.feed((line % (1, 2))[20:] + "\n")
    monitor.log.close()
    assert [r["step"] for r in RunDir(tmp_path).metrics()] == [1, 2], "each record once, in order"
    assert "Writing model shards" in (tmp_path / "logs" / "run.log").read_text()
