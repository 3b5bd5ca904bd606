"""Runs in their own processes: follow, stop, resume, kill -9, re-attach, concurrency, crashes, comparison.

Every run here is a real training process (tiny BERT, CPU) launched through `ortlab.launch`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import PYTHON
from gates import launch_gated, wait_paused
from listening import beyond_loopback, listening

import ortlab
from ortlab.accel import tcmalloc
from ortlab.runner import RunError

INSTALLED = tcmalloc.find() is not None  # (`scripts/dev setup` installs it: tests/test_tcmalloc.py)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture
def make_spec(tiny_bert, tmp_path):
    def make(name: str, max_steps: int = 30, ort: bool = False, **hyper) -> dict:
        return {
            "name": name,
            "output_dir": str(tmp_path / "runs"),
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 4000, "max_eval_samples": 32},
            "hyper": {"learning_rate": 1e-3, "batch_size": 8, "max_length": 32, "max_steps": max_steps, **hyper},
            "accel": {"ort": ort, "fused_adam": False},
        }

    return make


def first_step(run, timeout: float = 120) -> dict:
    for record in run.follow(timeout=timeout):
        if record["event"] == "step":
            return record
    raise AssertionError(f"no step within {timeout} s; status {run.status()}; log:\n{run.dir.log_path.read_text()}")


def steps_of(run) -> list[int]:
    return [r["step"] for r in run.metrics() if r["event"] == "step"]


def test_first_metric_arrives_while_running(make_spec):
    run = launch_gated(make_spec("live", max_steps=400), at_step=1)
    record = first_step(run)
    assert record["step"] == 1
    assert run.state == "running", "the first metric must arrive while the run is still going"
    assert run.stop()["state"] == "stopped"


def test_stop_then_resume_continues_from_the_checkpoint(make_spec):
    run = launch_gated(make_spec("stop-resume", max_steps=15), at_step=5)
    wait_paused(run)
    status = run.stop()
    assert status["state"] == "stopped", status
    stopped_at = status["step"]
    assert 5 <= stopped_at < 15
    checkpoint = Path(status["checkpoint"])
    assert checkpoint.name == f"checkpoint-{stopped_at}"
    assert (checkpoint / "trainer_state.json").exists()
    assert (checkpoint / "optimizer.pt").exists()
    assert run.result() is None, "a stopped run has no result yet"

    run.resume().wait(timeout=300)
    assert run.state == "completed", run.status()
    steps = steps_of(run)
    assert steps == list(range(1, 16)), "resume continues at the next step: no step twice, none missing"
    resumed = [r for r in run.metrics() if r["event"] == "resume"]
    assert [r["step"] for r in resumed] == [stopped_at]
    evals = [(r["phase"], r["step"]) for r in run.metrics() if r["event"] == "eval"]
    assert evals == [("before", 0), ("after", 15)], "each evaluation is written once, with its phase"
    assert run.result()["summary"]["steps"] == 15


def test_kill_9_ends_failed_and_keeps_every_metric_line(make_spec):
    run = launch_gated(make_spec("killed", max_steps=400), at_step=3)
    wait_paused(run)
    pid = run.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    status = run.wait(timeout=60)
    assert status["state"] == "failed"
    assert "killed" in status["error"]
    raw = run.dir.metrics_path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1].decode().splitlines()
    parsed = [json.loads(line) for line in complete]  # every complete line is intact JSON
    assert [r["step"] for r in parsed if r["event"] == "step"][:3] == [1, 2, 3]


def test_reattach_from_a_new_process_replays_history_then_follows_live(make_spec, tmp_path):
    # The run is held (control/pause) while the second process attaches, so it is running then however fast or
    # slow this machine is; released once the watcher has said it is attached.
    run = launch_gated(make_spec("attach", max_steps=15), at_step=5)
    wait_paused(run)
    assert steps_of(run) == [1, 2, 3, 4, 5], "held exactly after step 5"
    script = textwrap.dedent(
        f"""
        import json, sys, ortlab
        run = ortlab.attach({run.id!r}, root={str(run.path.parent)!r})
        state_at_attach = run.state
        print("ATTACHED", flush=True)
        steps = [r["step"] for r in run.follow() if r["event"] == "step"]
        print(json.dumps({{"state_at_attach": state_at_attach, "steps": steps, "final": run.state}}))
        """
    )
    proc = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ATTACHED", proc.stderr.read() if proc.poll() is not None else ""
        assert run.status().get("paused") is True or run.state == "running"
        run.unpause()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["state_at_attach"] == "running"
    assert seen["steps"] == list(range(1, 16)), "history from step 1, then live to the last step"
    assert seen["final"] == "completed"
    assert not run.status().get("paused"), "a finished run is not paused"


def test_two_concurrent_runs_with_different_mixes_then_compare(make_spec, tmp_path):
    a = ortlab.launch(make_spec("eager", max_steps=25))
    b = ortlab.launch(make_spec("with-ort", max_steps=25, ort=True))
    assert a.path != b.path
    assert a.wait(timeout=400)["state"] == "completed", a.dir.log_path.read_text()[-3000:]
    assert b.wait(timeout=400)["state"] == "completed", b.dir.log_path.read_text()[-3000:]
    assert steps_of(a) == steps_of(b) == list(range(1, 26))
    assert a.result()["accelerations"]["ort"]["applied"] is False
    assert b.result()["accelerations"]["ort"]["applied"] is True
    # ORT lives with tcmalloc: a launched run starts with it wherever it is installed ('auto')
    assert b.result()["accelerations"]["tcmalloc"]["applied"] is INSTALLED
    assert {r.id for r in ortlab.runs(tmp_path / "runs")} == {"eager", "with-ort"}

    ortlab_cli = str(Path(PYTHON).parent / "ortlab")
    proc = subprocess.run(
        [ortlab_cli, "compare", "eager", "with-ort", "--root", str(tmp_path / "runs"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in json.loads(proc.stdout)}
    assert rows["eager"]["ratios"]["samples_per_s"] == 1.0
    ratio = rows["with-ort"]["ratios"]["samples_per_s"]
    expected = rows["with-ort"]["summary"]["steady_samples_per_s"] / rows["eager"]["summary"]["steady_samples_per_s"]
    assert abs(ratio - expected) < 1e-9
    assert rows["with-ort"]["applied"] == (["ort", "tcmalloc"] if INSTALLED else ["ort"])
    table = subprocess.run(
        [ortlab_cli, "compare", "eager", "with-ort", "--root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "with-ort" in table.stdout
    assert "1.000" in table.stdout


def test_a_crash_at_step_k_ends_failed_with_error_and_traceback(make_spec, tmp_path, monkeypatch):
    # The crash is injected into the run process (sitecustomize) at step 4, as a corrupt batch would raise:
    # ortlab validates and tokenizes all data before training, so real bad data fails before step 1.
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import ortlab.train.trainer as t
            original = t.ORTTrainer.training_step
            def training_step(self, model, inputs, num_items_in_batch=None):
                if self.state.global_step == 3:
                    raise ValueError("corrupt batch: token id out of range at step 4")
                return original(self, model, inputs, num_items_in_batch)
            t.ORTTrainer.training_step = training_step
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(inject))
    run = ortlab.launch(make_spec("crash", max_steps=50))
    status = run.wait(timeout=300)
    assert status["state"] == "failed"
    assert "corrupt batch" in status["error"]
    assert "Traceback" in status["traceback"]
    assert "training_step" in status["traceback"]
    assert status["step"] == 3
    assert steps_of(run) == [1, 2, 3]
    with pytest.raises(RunError, match="no checkpoint"):
        run.resume()


def test_cli_lists_follows_and_reports(make_spec, tmp_path):
    run = ortlab.launch(make_spec("cli", max_steps=15))
    ortlab_cli = str(Path(PYTHON).parent / "ortlab")
    root = str(tmp_path / "runs")
    follow = subprocess.run([ortlab_cli, "follow", "cli", "--root", root], capture_output=True, text=True, timeout=300)
    assert follow.returncode == 0, follow.stderr
    assert "step     15" in follow.stdout
    assert "cli: completed" in follow.stdout
    listing = subprocess.run(
        [ortlab_cli, "runs", "--root", root],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "cli" in listing.stdout
    assert "completed" in listing.stdout
    missing = subprocess.run([ortlab_cli, "follow", "nope", "--root", root], capture_output=True, text=True)
    assert missing.returncode == 2
    assert "no run 'nope'" in missing.stderr
    assert run.state == "completed"


def test_bad_spec_is_refused_before_a_run_exists(tmp_path):
    from ortlab.spec import SpecError

    with pytest.raises(SpecError, match=r"hyper\.batch_size"):
        ortlab.launch({"hyper": {"batch_size": 0}, "output_dir": str(tmp_path)})
    assert not any(tmp_path.iterdir())


def test_run_in_another_python_environment(make_spec, tmp_path):
    # A second interpreter (its own venv) that sees the same packages through a .pth file: the run must
    # execute there, not in this interpreter.
    import sysconfig
    import venv

    other = tmp_path / "other-runtime"
    venv.EnvBuilder(with_pip=False).create(other)
    site = next((other / "lib").glob("python3*/site-packages"))
    (site / "dev-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    spec = make_spec("other-python", max_steps=5)
    spec["target"] = {"python": str(other / "bin" / "python")}
    run = ortlab.launch(spec)
    status = run.wait(timeout=300)
    assert status["state"] == "completed", run.dir.log_path.read_text()[-3000:]
    assert status["python"] == str(other / "bin" / "python")


def keys_a_stranger_reads(agent_pid: int) -> dict:
    """Connect to the rendezvous store of the run whose torchrun agent is `agent_pid`, as any local user can, and
    read the keys torch's own `env://` set-up gives a gloo group (the ranks' addresses): what a user who never saw
    the run's environment could name."""
    from datetime import timedelta

    import psutil
    import torch.distributed as dist

    ports = [c.laddr.port for c in psutil.Process(agent_pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
    connected, read = [], []
    for port in ports:
        client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=5), use_libuv=False)
        connected.append(client.num_keys())
        read += [k for k in ("default_pg/0//cpu//0/0", "default_pg/0//cpu//0/1") if client.check([k])]
    return {"connected": connected, "read": read}


def test_two_processes_zero1_through_the_launcher(make_spec):
    """Two processes under torchrun with ZeRO-1 train as one run; while they train, nothing of the run (torchrun's
    agent, its rendezvous store, gloo, DeepSpeed, the workers) listens beyond loopback, and another local user who
    connects to the store cannot read the group's keys."""
    spec = make_spec("zero1-x2", max_steps=8)
    spec["target"] = {"processes": 2}
    spec["accel"]["zero_stage"] = 1
    run = launch_gated(spec, at_step=2)
    try:
        wait_paused(run)
        found = listening(run.status()["pid"])
        seen = keys_a_stranger_reads(run.status()["pid"])
    finally:
        run.unpause()
    assert seen["connected"], "the stranger reached the store (the check below would prove nothing otherwise)"
    assert not seen["read"], f"a local user read the group's keys from its rendezvous store: {seen['read']}"
    assert found, "the run's rendezvous store listens (on loopback): the listing sees the run's sockets"
    assert not beyond_loopback(found), f"the run listens beyond loopback: {found}"
    status = run.wait(timeout=400)
    assert status["state"] == "completed", run.dir.log_path.read_text()[-4000:]
    assert status["world_size"] == 2
    zero = run.result()["accelerations"]["zero1"]
    assert zero["applied"] is True
    assert zero["details"]["world_size"] == 2
    # DeepSpeed, torchrun and gloo live with tcmalloc: torchrun's workers inherit it from the launched process
    assert run.result()["accelerations"]["tcmalloc"]["applied"] is INSTALLED
    step = next(r for r in run.metrics() if r["event"] == "step")
    assert step["samples"] == 16, "samples per step count both processes"
