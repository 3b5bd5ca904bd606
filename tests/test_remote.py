"""Remote runs on a real Ray head: `ortlab cluster`, launch, live metrics, stop/resume, a killed worker, errors.

The session's local cluster (conftest's `ray_head`: a head and a worker node, started through
`ortlab.cluster.start` on loopback with token auth, in its own folder, stopped by its PIDs at the end). Every run is
a real tiny-BERT training job submitted through Ray's Jobs API and watched through its local run folder, exactly as
a notebook would.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import stat
import threading
from pathlib import Path

import pytest
from gates import launch_gated, wait_paused
from listening import beyond_loopback, listening

import ortlab
from ortlab import cluster
from ortlab.cluster import head as cluster_head
from ortlab.job import channel
from ortlab.runfolder.compare import row_for
from ortlab.runfolder.place import bind
from ortlab.runfolder.processes import process_alive
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import RunError
from ortlab.runner import monitor as raymonitor
from ortlab.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("ray-cluster")]


@pytest.fixture
def head(ray_head):
    """The session's local Ray cluster (conftest), running."""
    return ray_head


@pytest.fixture(scope="module")
def make_spec(remote_spec):
    return remote_spec


def steps_of(run) -> list[int]:
    return [r["step"] for r in run.metrics() if r["event"] == "step"]


def assert_loopback_only(head) -> list[tuple[str, str, int]]:
    """Every listener of the head's and of each worker node's process tree is on loopback; returns the head's."""
    found = listening(head["pid"])
    for root in [head["pid"], *(node["pid"] for node in head.get("nodes") or [])]:
        exposed = beyond_loopback(listening(root))
        assert not exposed, f"the cluster (pid {root}) listens beyond loopback: {exposed}"
    return found


def test_cluster_start_records_the_head_and_keeps_its_token_private(head):
    record = cluster.status()
    assert record["running"] and record["pid"] == head["pid"]
    assert head["address"].startswith("http://127.0.0.1:")
    mode = stat.S_IMODE(cluster.token_path().stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert cluster.start()["pid"] == head["pid"], "a second start returns the running head"
    token = cluster.token_path().read_text()
    with pytest.raises(cluster.ClusterError, match=r"keeps the token it started with: stop it first"):
        cluster.start(new_token=True)
    assert cluster.token_path().read_text() == token, "a running head's token is not replaced under it"


def test_a_running_head_whose_worker_node_ended_is_not_handed_out(tmp_path):
    """A head whose node died would take jobs that wait for ever for the node's CPUs: start says so instead."""
    import subprocess
    import sys

    from ortlab.runfolder.processes import process_create_time

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    me = os.getpid()  # a live process stands for the head: nothing is started, nothing signalled
    record = {"pid": me, "create_time": process_create_time(me), "nodes": [{"pid": ended.pid, "create_time": 1.0}]}
    (tmp_path / "head.json").write_text(json.dumps(record))
    with pytest.raises(cluster.ClusterError, match=rf"1 of its 1 worker node\(s\) ended \(pid {ended.pid}\)"):
        cluster.start(folder=tmp_path)


def test_the_heads_session_folder_is_private_and_unpredictable(head):
    """Ray's session folder (sockets, logs, runtime envs) is inside a 0700 folder of ours with a random name: not
    /tmp/ortlab-ray-<uid>-<port>, a name another user could create first, and not Ray's 0777 folder itself."""
    temp = Path(head["temp_dir"])
    info = temp.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert (temp / "ray" / "session_latest" / "sockets").is_dir(), "Ray's files are inside the private folder"
    assert temp.parent == Path("/tmp") and temp.name.startswith("ortlab-ray-")
    suffix = temp.name.removeprefix("ortlab-ray-")
    ports = {str(port) for _, _, port in listening(head["pid"])}
    assert suffix not in ports and str(os.getuid()) not in suffix.split("-"), "the name says nothing guessable"


def test_every_listener_of_the_head_is_on_loopback(head):
    """GCS, raylet, workers, agents, the client server, the metrics servers: all bound to 127.0.0.1 (Ray alone
    binds most of them to all addresses or to the machine's address, even with --node-ip-address=127.0.0.1)."""
    found = assert_loopback_only(head)
    names = {name for name, _, _ in found}
    assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
    assert int(head["address"].rsplit(":", 1)[1]) in {port for _, _, port in found}
    (node,) = head["nodes"]  # the worker node: a raylet and its agents of its own, on loopback too
    assert {"raylet", "ray::DashboardAgent"} <= {name for name, _, _ in listening(node["pid"])}
    assert cluster_head.alive_nodes(head, cluster.cluster_dir()) == 2, "the head counts both nodes alive"


def test_a_squatter_on_the_heads_ports_never_receives_the_token(tmp_path, monkeypatch):
    """The ports ortlab hands to Ray are free when picked; another local user may listen there before Ray binds
    them. Here every such port is taken: the start fails with an error, and no squatter is ever sent the token."""
    squatters: list[socket.socket] = []

    def taken_ports(n: int) -> list[int]:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(16)
            s.setblocking(False)
            squatters.append(s)
        return [s.getsockname()[1] for s in squatters[-n:]]

    received = bytearray()
    done = threading.Event()

    def listen() -> None:
        conns: list[socket.socket] = []
        while not done.is_set():
            ready, _, _ = select.select(squatters + conns, [], [], 0.2)
            for s in ready:
                if s in squatters:
                    conn, _ = s.accept()
                    conn.setblocking(False)
                    conns.append(conn)
                else:
                    with contextlib.suppress(OSError):
                        received.extend(s.recv(65536))

    monkeypatch.setattr(cluster_head, "_free_ports", taken_ports)
    made: list[Path] = []
    real_temp = cluster_head._private_temp
    monkeypatch.setattr(cluster_head, "_private_temp", lambda: made.append(real_temp()) or made[-1])
    folder = tmp_path / "squatted"
    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        with pytest.raises(cluster.ClusterError, match=r"ended at start|did not answer"):
            cluster.start(folder, num_cpus=1, timeout=60)
    finally:
        done.set()
        listener.join(5)
        for s in squatters:
            s.close()
    token = (folder / "auth_token").read_bytes()
    assert squatters, "ports were handed out"
    assert token not in bytes(received) and b"Bearer" not in bytes(received), bytes(received)[:200]
    assert not cluster.status(folder)["running"]
    assert made and not made[0].exists(), "the failed head's session folder is removed"


def test_a_remote_run_streams_live_completes_and_comes_home(head, make_spec, capfd):
    run = launch_gated(make_spec("live", max_steps=12), at_step=3)
    wait_paused(run, timeout=150)
    assert run.state == "running"
    assert steps_of(run) == [1, 2, 3], "the metrics arrive while the job runs"
    assert_loopback_only(head)  # the job's driver and its training worker included
    # The job's log is everyone's: lines with ortlab's tag that are not its records (cut, or printed by other code)
    # are skipped and counted. One such line used to kill the monitor: the run ended failed, its model away.
    job_id = run.status()["launcher"]["job_id"]
    driver_log = next(Path(head["temp_dir"]).glob(f"**/session_*/logs/job-driver-{job_id}.log"))
    with driver_log.open("a") as f:  # (the job writes it in append mode too)
        f.write(channel.METRIC_TAG + '{"seq": 3, "record": {"ev\n' + channel.METRIC_TAG + "not json\n")
    # A second handle (a restarted kernel) follows from the start, with nothing twice.
    other = ortlab.attach(run.id, root=run.path.parent)
    run.unpause()
    records = list(other.follow(timeout=150))
    assert run.wait(timeout=60)["state"] == "completed", run.status()
    assert [r["step"] for r in records if r["event"] == "step"] == list(range(1, 13))
    storage = RunDir(run.status()["launcher"]["storage"])
    assert run.metrics() == storage.metrics(), "the local stream is the remote one, in order, each record once"
    assert (run.path / "model" / "config.json").is_file() and run.result()["summary"]["steps"] == 12
    assert "accelerations" in run.result()
    assert run.status()["skipped_lines"] == 2, run.status()
    assert row_for(run.dir).where == "cluster local", "`ortlab runs` says where it runs"
    report = run.export_onnx(samples=8, batch_sizes=(1,))
    assert report.good, report.to_dict()
    out = capfd.readouterr()
    assert cluster.token_path().read_text().strip() not in out.out + out.err
    assert_no_token(run.path, storage.path)
    assert "found in sys.modules" not in run.dir.log_path.read_text(), "runpy's warning about the -m entry"


def assert_no_token(*folders: Path) -> None:
    """Neither the local head's token nor the user's own ($RAY_AUTH_TOKEN) is in any file of these folders."""
    tokens = [cluster.token_path().read_text().strip(), os.environ.get("RAY_AUTH_TOKEN") or ""]
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not any(t and t.encode() in data for t in tokens), f"a token leaked into {path}"


def test_stop_resume_and_a_killed_worker(head, make_spec):
    """Two runs at once (the cluster offers a CPU on each of its nodes, each job asks for 1): one is stopped and
    resumed, the other's worker is killed."""
    run = launch_gated(make_spec("stop-resume", max_steps=8), at_step=3)
    doomed = launch_gated(make_spec("killed", max_steps=50), at_step=2)
    wait_paused(run, timeout=150)
    wait_paused(doomed, timeout=150)

    doomed_storage = RunDir(doomed.status()["launcher"]["storage"])
    os.kill(doomed_storage.read_status()["worker_pid"], signal.SIGKILL)

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
    assert_no_token(run.path, RunDir(run.status()["launcher"]["storage"]).path, doomed.path)


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


def test_clear_errors_before_anything_is_created(head, make_spec, tmp_path, monkeypatch):
    def refused(match: str, **target) -> None:
        spec = make_spec("bad", **target)
        spec["output_dir"] = str(tmp_path / "runs")
        with pytest.raises(RunError, match=match):
            ortlab.launch(spec)
        assert not (tmp_path / "runs").exists()

    free = cluster_head._free_ports(1)[0]
    # Fails fast: the plain request answers "unreachable" before Ray's own client (which retries for minutes) is built.
    import ray.job_submission

    built: list = []
    with monkeypatch.context() as m:
        m.setattr(ray.job_submission, "JobSubmissionClient", lambda *a, **k: built.append(a))
        refused(rf"http://127.0.0.1:{free} is unreachable", cluster=f"http://127.0.0.1:{free}", storage=str(tmp_path))
    assert built == [], "Ray's retrying client was built for an address that does not answer"
    refused(r"asks for 1 GPU\(s\) in all, but the cluster at local has 0", gpus_per_process=1)
    # fp16 is not refused by this CPU laptop when the spec is parsed, but by the cluster's own doctor.
    spec = make_spec("fp16")
    spec["accel"]["precision"] = "fp16"
    spec["output_dir"] = str(tmp_path / "runs")
    with pytest.raises(RunError, match=r"cannot start on the cluster:\n.*fp16 is not available in the cluster local"):
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
    with pytest.raises(cluster.ClusterError, match=r"with 2 node\(s\) is running .* then start one with 3"):
        cluster.start(nodes=3)
    assert cluster.stop()
    assert not process_alive(head["pid"], head["create_time"])
    assert not any(process_alive(n["pid"], n["create_time"]) for n in head["nodes"]), "its worker nodes end too"
    assert cluster.status()["running"] is False
    assert not cluster.stop(), "a second stop finds nothing to stop"
    assert json.loads(json.dumps(cluster.status()))["running"] is False
    assert not Path(head["temp_dir"]).exists()


def test_a_linked_token_file_is_refused_and_a_new_token_replaces_the_link(tmp_path):
    """A link where the token file should be is not followed (the old code chmodded its target and used it)."""
    other = tmp_path / "someone-elses-file"
    other.write_text("not a token")
    os.chmod(other, 0o644)
    (tmp_path / "auth_token").symlink_to(other)
    with pytest.raises(cluster.ClusterError, match=r"is a link or not a regular file.*--new-token"):
        cluster_head._ensure_token(tmp_path)
    assert stat.S_IMODE(other.stat().st_mode) == 0o644
    path = cluster_head._ensure_token(tmp_path, new=True)
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert other.read_text() == "not a token" and len(path.read_text()) == 64


def test_a_head_that_listens_beyond_loopback_is_refused(monkeypatch, tmp_path):
    """Should a Ray version bind anything to the network again, the start fails and names it (the real head's
    listeners are checked in test_every_listener_of_the_head_is_on_loopback)."""
    found = [(11, "raylet", "127.0.0.1", 40001), (12, "gcs_server", "::", 6379), (13, "agent", "192.0.2.2", 52365)]
    monkeypatch.setattr(cluster_head, "listeners", lambda pid: found)
    with pytest.raises(cluster.ClusterError, match=r"gcs_server \(pid 12\) on :::6379; agent \(pid 13\) on 192"):
        cluster_head._refuse_exposed({"pid": 10}, tmp_path)


def _monitor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None):
    """A RayJobMirror on a local run folder whose job's storage folder finished with a model and a result: the parts
    of a remote run that the monitor's parsing and its end work on, without a cluster. With `monkeypatch`, the
    storage is listed as the user's (a bring-home or resume outside the monitor goes through trust.storage_gate)."""
    if monkeypatch is not None:
        monkeypatch.setenv("ORTLAB_STORAGE_URIS", str(tmp_path / "storage"))
    local, storage = RunDir(tmp_path / "local"), RunDir(tmp_path / "storage" / "local")
    for run in (local, storage):
        (run.path / "logs").mkdir(parents=True)
    (storage.model_dir).mkdir()
    (storage.model_dir / "config.json").write_text("{}")
    storage.result_path.write_text(json.dumps({"summary": {"steps": 3}}))
    launcher = {"kind": "ray-job", "cluster": "local", "job_id": "job-1", "storage": str(storage.path)}
    local.status_path.write_text(json.dumps({"state": "running", "launcher": launcher}))
    spec = ortlab.RunSpec(target={"cluster": "local", "storage": str(tmp_path / "storage")})
    local.spec_path.write_text(spec.to_yaml())
    bind(storage, local)  # (what the launch does: the place is this folder's, `place.place_in`)
    return raymonitor.RayJobMirror(local.path, "local"), local


def test_bring_home_copies_a_finished_jobs_results_when_its_monitor_could_not(tmp_path, monkeypatch):
    """The launcher interface's bring_home: a monitor that died left the model on the storage; Run.bring_home()
    copies it (and result.json) into the local folder, through the run's own launcher, without a cluster."""
    from ortlab.runner import Run

    _, local = _monitor(tmp_path, monkeypatch)
    assert not local.model_dir.exists() and local.result() is None
    Run(local.path).bring_home()
    assert (local.model_dir / "config.json").read_text() == "{}"
    assert local.result() == {"summary": {"steps": 3}}


def test_a_remote_folder_the_status_names_is_used_only_where_the_launch_puts_it(tmp_path):
    """status.json is the folder's: a planted `launcher.storage` naming another folder made resume claim that
    folder (its status rewritten, its control files removed) and the monitor bring its files home."""
    _, local = _monitor(tmp_path)
    assert raymonitor.recorded_storage(local, RunSpec.from_run(local)).path == tmp_path / "storage" / "local"
    victim = tmp_path / "victim" / "local"  # the run's own name, but outside the spec's storage
    (victim / "control").mkdir(parents=True)
    (victim / "control" / "stop").write_text("theirs")
    elsewhere = tmp_path / "storage" / "someone-else"  # inside the storage, another run's folder
    linked = tmp_path / "storage" / "local-abcdef"
    linked.symlink_to(victim, target_is_directory=True)
    for planted in (victim, elsewhere, linked, "/", 7):
        status = json.loads(local.status_path.read_text())
        status["launcher"]["storage"] = planted if planted == 7 else str(planted)
        local.status_path.write_text(json.dumps(status))
        with pytest.raises(RunError, match="will not use that folder"):
            raymonitor.recorded_storage(local, RunSpec.from_run(local))
        with pytest.raises(RunError, match="will not use that folder"):
            raymonitor.RayJobMirror(local.path, "local")
    assert (victim / "control" / "stop").read_text() == "theirs"


def test_a_refused_remote_folder_is_named_beside_where_the_launch_puts_it(tmp_path, monkeypatch):
    """The refusal names the place `new_place` would have made: for an object store the run id goes in the URI's
    path, before its options (it was printed after them, as `s3://b/runs?endpoint_override=h/<run id>`)."""
    from ortlab.runfolder.objstore import Store
    from ortlab.runfolder.place import storage_at

    _, local = _monitor(tmp_path)
    status = json.loads(local.status_path.read_text())
    status["launcher"]["storage"] = "s3://bucket/elsewhere/local?endpoint_override=localhost:9"
    local.status_path.write_text(json.dumps(status))
    with pytest.raises(RunError) as folder:
        raymonitor.recorded_storage(local, RunSpec.from_run(local))
    assert f"which is not {tmp_path / 'storage' / 'local'} " in str(folder.value)
    store = storage_at(Store("s3://bucket/runs?endpoint_override=localhost:9&scheme=http"))
    monkeypatch.setattr(raymonitor, "storage_for", lambda spec: store)
    with pytest.raises(RunError) as stored:
        raymonitor.recorded_storage(local, RunSpec.from_run(local))
    assert "which is not s3://bucket/runs/local?endpoint_override=localhost:9&scheme=http " in str(stored.value)


class _EndedJob:
    """What the monitor's end asks a Ray Jobs client: the log of a job that has ended."""

    def __init__(self, logs: str):
        self.logs = logs

    def get_job_logs(self, job_id: str) -> str:
        return self.logs

    async def tail_job_logs(self, job_id: str):  # (the catch-up reads the log's tail: from here, its stream)
        yield self.logs

    def get_job_info(self, job_id: str):
        raise ConnectionError("the head went away")


def test_the_monitor_skips_bad_tagged_lines_and_still_brings_the_results_home(tmp_path):
    """A line with the metric tag that is not ortlab's record (cut, garbled, printed by other code) used to raise
    out of feed: the monitor re-read the log in a loop and a job that succeeded ended failed, with no model."""
    monitor, local = _monitor(tmp_path)
    tag = channel.METRIC_TAG
    good = [tag + json.dumps({"seq": i, "record": {"event": "step", "step": i + 1}}) for i in range(3)]
    bad = [
        channel.METRIC_TAG + '{"seq": 0, "record": {"event": "st',  # cut short
        channel.METRIC_TAG + "print('hello')",  # another program's output
        channel.METRIC_TAG + '{"seq": "0", "record": "step"}',  # JSON, not ortlab's shape
        channel.METRIC_TAG + "[1, 2]",
        channel.PAUSED_TAG + '"maybe"',
        channel.METRIC_TAG + "1" * 5000,  # a number Python will not convert
    ]
    final = channel.FINAL_TAG + json.dumps({"state": "completed", "step": 3})
    log = "\n".join([*bad[:2], good[0], *bad[2:], *good[1:], final]) + "\n"
    monitor.begin_read()
    monitor.feed(log)
    monitor.begin_read()
    monitor.feed(log)  # the stream read again from its start (a lost connection): nothing twice, not counted twice
    assert [r["step"] for r in local.metrics()] == [1, 2, 3]
    assert local.read_status()["skipped_lines"] == 6
    monitor.finish("SUCCEEDED", _EndedJob(log), "")
    status = local.read_status()
    assert status["state"] == "completed", status
    assert status["skipped_lines"] == 6 and "6 line(s)" in status["warning"], status
    assert (local.model_dir / "config.json").is_file() and local.result()["summary"]["steps"] == 3
    assert "print('hello')" in local.log_path.read_text(), "what was skipped is in the run's log"


def test_one_failing_step_of_the_monitors_end_does_not_keep_the_model_away(tmp_path, monkeypatch):
    monitor, local = _monitor(tmp_path)
    monitor.feed(channel.FINAL_TAG + json.dumps({"state": "completed", "step": 3}) + "\n")

    def broken(self, client):
        raise OSError("disk full")

    monkeypatch.setattr(raymonitor.RayJobMirror, "catch_up", broken)
    monitor.finish("SUCCEEDED", _EndedJob(""), "")
    status = local.read_status()
    assert status["state"] == "completed" and (local.model_dir / "config.json").is_file(), status
    assert "disk full" in status["monitor_problems"][0]
    # A monitor that fails outright says so in the status, with what to do, and brings home what is there.
    monitor, local = _monitor(tmp_path / "again")
    monkeypatch.setattr(raymonitor.RayJobMirror, "follow", lambda self: 1 / 0)
    monkeypatch.setattr(raymonitor, "RayJobMirror", lambda path, cluster: monitor)
    assert raymonitor.monitor_main(str(local.path), "local") == 1
    status = local.read_status()
    assert status["state"] == "failed" and "ZeroDivisionError" in status["error"], status
    # (no head runs here: the job could not be stopped, and the message says why no command is needed)
    assert "job-1 could not be stopped" in status["error"] and "head is not running" in status["error"], status
    assert (local.model_dir / "config.json").is_file()


def test_the_monitor_finds_a_tag_behind_another_writers_partial_line(tmp_path):
    """Seen in the benchmark: a progress bar's '\\r' line without a newline ran into a metric line of the job's log."""
    monitor, local = _monitor(tmp_path)
    line = '{"seq": %d, "record": {"event": "step", "step": %d}}'
    monitor.feed("Writing model shards:   0%|  | 0/1\r" + channel.METRIC_TAG + line % (0, 1) + "\n")
    monitor.feed(channel.METRIC_TAG + line % (0, 1) + "\n" + channel.METRIC_TAG + (line % (1, 2))[:20])
    monitor.feed((line % (1, 2))[20:] + "\n")
    monitor.log.close()
    assert [r["step"] for r in local.metrics()] == [1, 2], "each record once, in order"
    assert "Writing model shards" in local.log_path.read_text()


def test_new_token_replaces_the_token_and_the_old_one_is_refused(tmp_path, monkeypatch):
    """`ortlab cluster start --new-token` on a stopped head: a new 0600 token, and the new head refuses the old one.

    It starts a second head (the module's own was stopped by the test above): 10-20 s on an idle machine, 650 MB
    while it runs, so it runs last and alone."""
    import urllib.error
    import urllib.request

    from typer.testing import CliRunner

    from ortlab.cli import app

    monkeypatch.setenv("ORTLAB_CLUSTER_DIR", str(tmp_path / "cluster"))
    (tmp_path / "cluster").mkdir()
    old = cluster_head._ensure_token(tmp_path / "cluster").read_text().strip()  # what the previous head used
    runner = CliRunner()
    try:
        out = runner.invoke(app, ["cluster", "start", "--new-token", "--num-cpus", "1"])
        assert out.exit_code == 0, out.output
        new = cluster.token_path().read_text().strip()
        assert new != old and len(new) == 64
        assert stat.S_IMODE(cluster.token_path().stat().st_mode) == 0o600
        address = cluster.status()["address"]
        request = urllib.request.Request(address + "/api/jobs/", headers={"Authorization": f"Bearer {old}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code in (401, 403)
        cluster.connect("local")  # the new token is accepted
    finally:
        cluster.stop()
