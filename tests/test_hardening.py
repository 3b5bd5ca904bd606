"""Hardening: hostile names and data, status races, processes that never start, unreadable files, published
secrets. Fast tests: no model is trained here (the slow, multi-process ones are in test_runs.py and
test_reliability.py)."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON

import ortlab
from ortlab import envvars
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir, RunStateError
from ortlab.runner import Run, RunError
from ortlab.spec import RunSpec, SpecError

HOSTILE = "<img src=x onerror=alert(1)>"


def make_run(root: Path, name: str = "r", **spec) -> RunDir:
    return RunDir.create(root, RunSpec.parse({"name": name, **spec}))


# --- names and ids stay inside the runs folder -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", "a/b", "..", ".", ".hidden", "-flag", "x" * 101, "a\nb", ""])
def test_hostile_run_names_are_refused_by_the_spec(name, tmp_path):
    with pytest.raises(SpecError, match="name"):
        RunSpec.parse({"name": name, "output_dir": str(tmp_path / "runs")})
    with pytest.raises(SpecError):
        ortlab.launch({"name": name, "output_dir": str(tmp_path / "runs")})
    assert list(tmp_path.iterdir()) == [], "nothing is written for a refused spec"


def test_a_run_folder_is_created_inside_the_root_even_when_the_spec_is_bypassed(tmp_path):
    spec = RunSpec()
    object.__setattr__(spec, "name", "../escaped")  # as if a spec had skipped validation
    with pytest.raises(ValueError, match="not allowed"):
        RunDir.create(tmp_path / "runs", spec)
    assert not (tmp_path / "escaped").exists()


def test_default_names_are_short_telling_and_distinct(tmp_path):
    a = RunDir.create(tmp_path, RunSpec())
    b = RunDir.create(tmp_path, RunSpec())
    assert a.id.startswith("cls-all-minilm-l6-v2-"), a.id
    assert a.id != b.id
    assert len(a.id) <= 40


@pytest.mark.parametrize("run_id", ["..", "../outside", "/etc", "x/../../outside", "outside/..", "link"])
def test_ids_that_escape_the_root_are_refused(tmp_path, run_id):
    root = tmp_path / "runs"
    make_run(root, "inside")
    outside = make_run(tmp_path, "outside")  # a real run folder next to the root, not in it
    (root / "link").symlink_to(outside.path)
    with pytest.raises(RunError):
        ortlab.attach(run_id, root=root)
    assert ortlab.attach("inside", root=root).id == "inside"
    assert [r.id for r in ortlab.runs(root)] == ["inside"], "runs() does not follow symlinks out of the root"


def test_cli_refuses_escaping_ids_for_every_command(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "inside")
    make_run(tmp_path, "outside")
    cli = str(Path(PYTHON).parent / "ortlab")
    commands = (["follow"], ["stop"], ["resume"], ["export"], ["serve"], ["push", "--to-folder", str(tmp_path / "p")])
    for command in commands:
        proc = subprocess.run(
            [cli, *command[:1], "../outside", *command[1:], "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert "not a run folder inside" in proc.stderr
    assert not (tmp_path / "p").exists()


# --- HTML from data and users is escaped --------------------------------------------------------------------------


def test_workbench_escapes_hostile_columns_labels_names_and_errors(tmp_path):
    pytest.importorskip("ipywidgets")
    from ortlab.ui import Workbench

    data = tmp_path / "hostile.csv"
    rows = [f'"{HOSTILE} review {i}",{HOSTILE if i % 2 else "<b>bold</b>"}' for i in range(40)]
    data.write_text(f'"{HOSTILE}",label\n' + "\n".join(rows) + "\n")
    wb = Workbench(root=str(tmp_path / "runs"))
    wb.data.value = str(data)
    wb.inspect_data()
    assert HOSTILE not in wb.data_preview.value
    assert html.escape(HOSTILE) in wb.data_preview.value
    assert "<b>bold</b>" not in wb.data_preview.value

    wb.name.value = HOSTILE  # an invalid name: the problem list quotes it
    assert wb.validate() is False
    assert HOSTILE not in wb.problems.value
    assert "&lt;img" in wb.problems.value

    wb.data.value = str(tmp_path / f"{HOSTILE}.csv")  # a missing file: the error message quotes the path
    wb.inspect_data()
    assert HOSTILE not in wb.data_preview.value

    wb.name.value = ""
    bundle = wb._repr_mimebundle_()
    assert HOSTILE not in bundle["text/html"]


def test_chart_labels_and_run_tables_escape_run_ids(tmp_path):
    pytest.importorskip("ipywidgets")
    from ortlab.ui.charts import RunMonitor
    from ortlab.ui.summary import rows, run_label, table_html

    folder = tmp_path / HOSTILE.replace("/", "")  # a folder made by hand, not through ortlab
    folder.mkdir()
    (folder / "status.json").write_text(json.dumps({"state": "completed"}))
    (folder / "spec.yaml").write_text(RunSpec().to_yaml())
    run = Run(folder)
    label = run_label(None, run.id, {"ort": {"requested": True, "applied": True}})
    assert "<img" not in label and "&lt;img" in label
    assert "<img" not in table_html(rows([run]))
    monitor = RunMonitor()
    monitor.add_run(run, follow=False)
    monitor._set_status()
    assert "<img" not in monitor.status.value
    monitor.close()


# --- status: one state machine, under a lock -----------------------------------------------------------------------


def test_a_liveness_check_never_overwrites_a_completed_run(tmp_path, monkeypatch):
    import ortlab.runfolder.processes as processes
    import ortlab.runfolder.rundir as rundir

    run = make_run(tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"])
    run.update_status(pid=sleeper.pid, create_time=processes.process_create_time(sleeper.pid))
    run.set_status("running")
    sleeper.kill()
    sleeper.wait()
    # The reader has seen a dead pid; before it writes 'failed', the worker reports 'completed'.
    real = rundir.RunDir._looks_dead
    calls = []

    def racing(status):
        calls.append(1)
        if len(calls) == 1:
            run.set_status("completed", step=5)
        return real(status)

    monkeypatch.setattr(rundir.RunDir, "_looks_dead", staticmethod(racing))
    assert run.status()["state"] == "completed"
    assert run.read_status()["step"] == 5


def test_pending_from_a_launcher_never_overwrites_running(tmp_path):
    run = make_run(tmp_path)
    run.set_status("running", worker_pid=os.getpid())
    with pytest.raises(RunStateError):
        run.set_status("pending", pid=123)
    run.update_status(pid=os.getpid())  # what a launcher does once its process exists
    assert run.read_status()["state"] == "running"


def test_terminal_states_are_final(tmp_path):
    run = make_run(tmp_path)
    run.set_status("running")
    run.set_status("completed")
    for state in ("running", "failed", "stopped", "pending"):
        with pytest.raises(RunStateError):
            run.set_status(state)


def _stopped_run_with_checkpoint(root: Path, **spec) -> RunDir:
    run = make_run(root, "stopped", **spec)
    run.set_status("stopped", step=3)
    ckpt = run.checkpoints / "checkpoint-3"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    return run


def test_two_concurrent_resumes_start_one_worker(tmp_path, monkeypatch):
    import ortlab.runner as runner

    run = _stopped_run_with_checkpoint(tmp_path)
    started = []
    gate = threading.Barrier(4)

    def fake_start(run_dir, spec, resume=False, cwd=None, hub_token=True):
        started.append(run_dir.id)
        return None

    monkeypatch.setattr(runner, "_start", fake_start)
    outcomes = []

    def resume():
        gate.wait()
        try:
            Run(run.path).resume()
            outcomes.append("started")
        except RunError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=resume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert started == ["stopped"], outcomes
    assert outcomes.count("started") == 1
    assert all("only a stopped or failed run can resume" in o for o in outcomes if o != "started")


def _planted_python(folder: Path) -> tuple[Path, Path]:
    """An executable a planted run folder names as its interpreter, and the marker file it writes if started."""
    folder.mkdir(parents=True, exist_ok=True)
    marker, program = folder / "it-ran", folder / "python"
    program.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")  # executable, but not a Python that runs ortlab
    program.chmod(0o755)
    return program, marker


def test_resume_never_starts_an_interpreter_a_run_folder_names(tmp_path, monkeypatch):
    monkeypatch.delenv("ORTLAB_TRUSTED_PYTHONS", raising=False)
    program, marker = _planted_python(tmp_path / "planted")
    run = _stopped_run_with_checkpoint(tmp_path / "runs", target={"python": str(program)})
    with pytest.raises(RunError, match=r"does not start a program that a run folder names.*--python.*TRUSTED_PYTHONS"):
        Run(run.path).resume()
    assert not marker.exists(), "the folder's program was started"
    assert run.read_status()["state"] == "stopped", "nothing claimed, nothing changed"

    # A link to this very interpreter in another folder is not this interpreter (it would read that folder's
    # pyvenv.cfg and site-packages): refused too.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    linked = _stopped_run_with_checkpoint(tmp_path / "runs-link", target={"python": str(tmp_path / "venv/bin/python")})
    with pytest.raises(RunError, match="does not start a program"):
        Run(linked.path).resume()

    # The user names it (an argument, or the setting): the check passes and the interpreter check starts it.
    with pytest.raises(RunError, match="not a Python that can run ortlab"):
        Run(run.path).resume(python=str(program))
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("ORTLAB_TRUSTED_PYTHONS", f"/elsewhere/bin/python{os.pathsep}{program}")
    with pytest.raises(RunError, match="not a Python that can run ortlab"):
        Run(run.path).resume()
    assert marker.exists()
    with pytest.raises(RunError, match="not an executable file"):
        Run(run.path).resume(python=str(tmp_path / "missing-python"))
    assert run.read_status()["state"] == "stopped"


def test_cli_resume_names_the_interpreter(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ortlab.cli import app

    monkeypatch.delenv("ORTLAB_TRUSTED_PYTHONS", raising=False)
    program, marker = _planted_python(tmp_path / "planted")
    run = _stopped_run_with_checkpoint(tmp_path / "runs", target={"python": str(program)})
    out = CliRunner().invoke(app, ["resume", "stopped", "--root", str(tmp_path / "runs")])
    assert out.exit_code == 2 and "--python" in out.output and not marker.exists(), out.output
    out = CliRunner().invoke(app, ["resume", "stopped", "--root", str(tmp_path / "runs"), "--python", str(program)])
    assert out.exit_code == 2 and "not a Python" in out.output and marker.exists(), out.output
    assert run.read_status()["state"] == "stopped"


def test_resume_sends_nothing_to_a_cluster_a_run_folder_names(tmp_path, monkeypatch):
    from header_recorder import recording_server

    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-users-ray-token")
    monkeypatch.delenv("ORTLAB_RAY_ADDRESSES", raising=False)
    monkeypatch.setenv("ORTLAB_STORAGE_URIS", str(tmp_path / "storage"))  # (the storage is the user's: see #48)
    with recording_server("127.0.0.2") as (address, seen):
        target = {"cluster": address, "storage": str(tmp_path / "storage")}
        run = _stopped_run_with_checkpoint(tmp_path / "runs", target=target)
        with pytest.raises(RunError, match=r"names the Ray cluster.*--cluster.*ORTLAB_RAY_ADDRESSES"):
            Run(run.path).resume()
        assert seen == [], "a request went to the address a run folder names"
        assert run.read_status()["state"] == "stopped"
        # A configured address elsewhere is not this one.
        monkeypatch.setenv("ORTLAB_RAY_ADDRESSES", "http://127.0.0.2:1, local")
        with pytest.raises(RunError, match="names the Ray cluster"):
            Run(run.path).resume()
        assert seen == []
        # The user names it (argument, or the setting): past the check, the token goes there (it is no Ray server,
        # so the resume fails after that).
        for allow in ({"cluster": address}, {}):
            monkeypatch.setenv("ORTLAB_RAY_ADDRESSES", "" if allow else address)
            with pytest.raises(RunError, match="not as a Ray dashboard"):
                Run(run.path).resume(**allow)
            assert seen and seen[0]["headers"].get("Authorization") == "Bearer the-users-ray-token", seen
            seen.clear()
            assert run.read_status()["state"] == "stopped"


@pytest.mark.parametrize(
    "address",
    ["http://ray:s3cret-Tok@127.0.0.2:8265", "https://s3cret-Tok@ray.example:443", "http://h:8265/?token=s3cret-Tok"],
)
def test_credentials_in_a_cluster_address_are_refused_before_anything_is_stored(tmp_path, address):
    spec = {"output_dir": str(tmp_path / "runs"), "target": {"cluster": address, "storage": str(tmp_path / "s")}}
    with pytest.raises(SpecError, match=r"target\.cluster: the address carries (credentials|a credential)") as e:
        ortlab.launch(spec)
    assert "s3cret-Tok" not in str(e.value), "the refusal quotes the secret"
    assert "RAY_AUTH_TOKEN" in str(e.value)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "s").exists()
    from ortlab import cluster

    with pytest.raises(cluster.ClusterError, match="carries") as e:
        cluster.connect(address, trusted=True)
    assert "s3cret-Tok" not in str(e.value)


def test_the_ray_token_goes_only_where_the_user_named(monkeypatch):
    from ortlab import cluster

    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok")
    monkeypatch.delenv("ORTLAB_RAY_ADDRESSES", raising=False)
    assert cluster.token_for("http://h:8265")[0] is None
    assert "withheld" in cluster.token_for("http://h:8265")[1]
    assert cluster.token_for("http://h:8265", trusted=True)[0] == "tok"
    monkeypatch.setenv("ORTLAB_RAY_ADDRESSES", "https://other:8265, HTTP://H:8265/")
    assert cluster.token_for("http://h:8265")[0] == "tok", "one server, two spellings"
    assert cluster.token_for("http://h:8266")[0] is None, "another port is another server"
    assert cluster.token_for("https://h:8265")[0] is None, "another scheme is another server"


def test_a_token_never_travels_in_clear_to_another_machine_unasked(monkeypatch):
    from ortlab import cluster

    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok")
    monkeypatch.delenv("ORTLAB_RAY_ALLOW_HTTP", raising=False)
    # 192.0.2.1 is TEST-NET-1: never routed. The refusal comes before any connection.
    with pytest.raises(cluster.ClusterError, match=r"travel in clear.*ORTLAB_RAY_ALLOW_HTTP=1"):
        cluster.connect("http://192.0.2.1:8265", trusted=True)
    for fine in ("http://127.0.0.1:8265", "http://127.0.0.2:8265", "http://localhost:8265", "http://[::1]:8265"):
        cluster.check_transport(fine)  # loopback never leaves the machine
    cluster.check_transport("https://192.0.2.1:8265")
    monkeypatch.setenv("ORTLAB_RAY_ALLOW_HTTP", "1")
    cluster.check_transport("http://192.0.2.1:8265")


def test_resume_checks_the_stored_mix_against_this_machine(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("fp16 runs here")
    run = _stopped_run_with_checkpoint(tmp_path)
    spec = RunSpec.parse({"name": "stopped"}).model_dump(mode="json")
    spec["accel"]["precision"] = "fp16"  # as a GPU machine would have written it
    import yaml

    run.spec_path.write_text(yaml.safe_dump(spec))
    assert RunSpec.from_run(run).accel.precision == "fp16", "a stored spec loads whatever machine wrote it"
    with pytest.raises(RunError, match="fp16 needs a CUDA device"):
        Run(run.path).resume()
    assert run.read_status()["state"] == "stopped"


def test_launch_refuses_a_missing_interpreter_before_a_folder_exists(tmp_path):
    with pytest.raises(RunError, match=r"target\.python"):
        ortlab.launch({"output_dir": str(tmp_path / "runs"), "target": {"python": "/nonexistent/python3"}})
    assert not (tmp_path / "runs").exists()


def test_a_process_that_cannot_start_ends_the_run_failed(tmp_path, monkeypatch):
    import ortlab.runner as runner

    run = make_run(tmp_path)

    spec = RunSpec()
    broken = spec.model_copy(update={"target": spec.target.model_copy(update={"python": str(tmp_path / "gone")})})
    with pytest.raises(RunError, match="could not start"):
        runner._start(run, broken)
    status = run.status()
    assert status["state"] == "failed"
    assert "could not be started" in status["error"]


def test_a_run_claimed_but_never_started_ends_failed(tmp_path, monkeypatch):
    import ortlab.runfolder.rundir as rundir

    run = make_run(tmp_path)  # pending, no process recorded (a launcher that died before Popen)
    assert run.status()["state"] == "pending"
    monkeypatch.setattr(rundir, "START_GRACE_S", 0.0)
    time.sleep(0.05)
    status = run.status()
    assert status["state"] == "failed"
    assert "never started" in status["error"]


@pytest.mark.parametrize("damage", ["garbage", "delete"])
def test_follow_and_wait_end_on_an_unreadable_status(tmp_path, monkeypatch, damage):
    import ortlab.runner as runner

    monkeypatch.setattr(runner, "UNREADABLE_GRACE_S", 0.3)
    run = make_run(tmp_path)
    run.update_status(pid=os.getpid(), create_time=process_create_time(os.getpid()))
    if damage == "garbage":
        run.status_path.write_text("{not json")
    else:
        run.status_path.unlink()
    handle = Run(run.path)
    with pytest.raises(RunError, match=r"status\.json"):
        handle.wait(timeout=30, poll_s=0.05)
    with pytest.raises(RunError, match=r"status\.json"):
        list(handle.follow(poll_s=0.05, timeout=30))


def test_stop_never_signals_a_process_that_is_not_the_run(tmp_path):
    from ortlab.runfolder.processes import process_create_time

    run = make_run(tmp_path)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run.update_status(pid=bystander.pid, create_time=process_create_time(bystander.pid))
        run.set_status("running")
        with pytest.raises(RunError, match="nothing was signalled"):
            Run(run.path).stop(timeout=0.5)
        assert bystander.poll() is None, "the bystander process must still be alive"
    finally:
        bystander.kill()
        bystander.wait()


def test_launched_runs_do_not_inherit_a_kernels_process_group(monkeypatch):

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    env = envvars.child_env()
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == envvars.ortlab_path()


# --- files: durable, whole, never torn into the next record ---------------------------------------------------------


def test_an_append_after_a_torn_line_keeps_the_next_record(tmp_path):
    from ortlab.runfolder.rundir import read_metrics
    from ortlab.train.metricswriter import JsonLinesSink

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "step", "step": 1}\n{"event": "step", "st')  # a writer killed mid-line
    sink = JsonLinesSink(path)
    sink({"event": "resume", "step": 1})
    sink({"event": "step", "step": 2})
    sink.close()
    records, _ = read_metrics(path)
    assert [(r["event"], r["step"]) for r in records] == [("step", 1), ("resume", 1), ("step", 2)]


def test_the_embedded_dataset_is_written_whole_by_concurrent_first_runs(tmp_path, monkeypatch):
    from ortlab.assets import embedded_dataset

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    script = "from ortlab.assets import embedded_dataset; print(embedded_dataset('rotten-tomatoes')[0])"
    procs = [subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    path, _ = embedded_dataset("rotten-tomatoes")
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "text,label" and len(lines) > 10000
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


# --- data and models: fail before anything loads, naming the fix -------------------------------------------------


def _csv(path: Path, rows: list[tuple[str, object]]) -> Path:
    path.write_text("text,label\n" + "\n".join(f'"{t}",{label}' for t, label in rows) + "\n")
    return path


def test_labels_only_in_the_eval_split_fail_before_a_model_loads(tmp_path, monkeypatch):
    import datasets

    from ortlab.data import DataError, checks, load_and_check
    from ortlab.spec import DataSpec

    train = datasets.Dataset.from_dict({"text": [f"t {i}" for i in range(20)], "label": ["neg", "pos"] * 10})
    evaluation = datasets.Dataset.from_dict({"text": ["odd", "fine"], "label": ["neutral", "pos"]})
    monkeypatch.setattr(checks, "load_raw", lambda spec: ({"train": train, "validation": evaluation}, []))
    with pytest.raises(DataError, match="'neutral'"):
        load_and_check(DataSpec(source="some/hub-id", eval_split="validation"), "sequence-classification", 0)

    # Integer labels outside the training classes are caught the same way (not passed on unmapped).
    train = datasets.Dataset.from_dict({"text": [f"t {i}" for i in range(30)], "label": [i % 3 for i in range(30)]})
    evaluation = datasets.Dataset.from_dict({"text": ["x", "y"], "label": [7, 1]})
    monkeypatch.setattr(checks, "load_raw", lambda spec: ({"train": train, "validation": evaluation}, []))
    with pytest.raises(DataError, match="'7'"):
        load_and_check(DataSpec(source="some/hub-id", eval_split="validation"), "sequence-classification", 0)

    # Token tags too.
    train = datasets.Dataset.from_dict({"tokens": [["a", "b"]] * 4, "ner_tags": [["O", "B-PER"]] * 4})
    evaluation = datasets.Dataset.from_dict({"tokens": [["c"]], "ner_tags": [["B-LOC"]]})
    monkeypatch.setattr(checks, "load_raw", lambda spec: ({"train": train, "validation": evaluation}, []))
    with pytest.raises(DataError, match="'B-LOC'"):
        load_and_check(DataSpec(source="some/hub-id", eval_split="validation"), "token-classification", 0)


@pytest.mark.parametrize(
    ("config", "message"),
    [("{broken", "is not valid JSON"), ('{"hidden_size": 4}', "no 'model_type'"), ('{"model_type": "nope"}', "'nope'")],
)
def test_a_corrupt_model_config_is_a_clear_error(tmp_path, config, message):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    cli = str(Path(PYTHON).parent / "ortlab")
    proc = subprocess.run(
        [cli, "train", "--model", str(folder), "--output-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "config.json" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_impossible_mix_lists_one_line_per_problem_and_nothing_else(tmp_path):
    with pytest.raises(SpecError) as info:
        RunSpec.parse({"accel": {"ort": True, "torch_compile": True, "zero_stage": 3}, "name": "x"})
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid run spec:"
    assert all(line.startswith("  - accel: ") for line in lines[1:]), lines
    assert len(lines) >= 3
    assert "{" not in str(info.value), "the spec itself is not printed"


def test_follow_prints_a_nan_loss_instead_of_crashing(tmp_path):
    run = make_run(tmp_path)
    run.set_status("running")
    with run.metrics_path.open("w") as f:
        f.write(json.dumps({"event": "step", "step": 1, "loss": None, "samples_per_s": 3.0}) + "\n")
        f.write(json.dumps({"event": "eval", "phase": "after", "step": 1, "eval_loss": None}) + "\n")
    run.set_status("completed")
    cli = str(Path(PYTHON).parent / "ortlab")
    proc = subprocess.run([cli, "follow", run.id, "--root", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "loss -" in proc.stdout


def test_a_worker_is_recognised_by_its_command_line_and_create_time(tmp_path):
    # Before stop signals a process group, the recorded pid must be this folder's worker, started when recorded.
    from ortlab.runfolder.processes import process_create_time
    from ortlab.runner.local import is_run_process as _is_run_process

    run = make_run(tmp_path)
    fake_worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "ortlab.lifecycle", str(run.path.resolve())],
        start_new_session=True,
    )
    try:
        cmdline = Path(f"/proc/{fake_worker.pid}/cmdline")
        deadline = time.monotonic() + 10
        while b"ortlab.lifecycle" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd (before, it is a copy of pytest, with pytest's command line)
        status = {"pid": fake_worker.pid, "create_time": process_create_time(fake_worker.pid)}
        assert _is_run_process(run, status)
        assert not _is_run_process(run, {**status, "create_time": status["create_time"] - 10})
        os.killpg(fake_worker.pid, signal.SIGTERM)
        fake_worker.wait(timeout=10)
    finally:
        fake_worker.kill()


def test_the_in_process_zero_group_listens_on_loopback_only(tmp_path):
    # A notebook that trains with ZeRO gets a one-process group: it must open no port on other interfaces.
    script = f"""
import json, psutil, torch, torch.distributed as dist
from ortlab.train.args import ORTTrainingArguments
ORTTrainingArguments(output_dir={str(tmp_path)!r}, zero_stage=1, use_ort=False, report_to=[])
t = torch.ones(1)
dist.all_reduce(t)
print(json.dumps(sorted({{c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"}})))
"""
    proc = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listening = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(listening) <= {"127.0.0.1", "::1"}, listening


def test_damaged_run_folders_do_not_break_any_view(tmp_path):
    # Hand-edited or damaged files: every view lists the run and says what it can, nothing crashes or hangs.
    root = tmp_path / "runs"
    bad = {
        "garbage-spec": ("{not yaml: [", '{"state": "completed"}', ""),
        "garbage-status": (None, "not json", ""),
        "list-status": (None, "[1, 2]", ""),
        "forged-pid": (None, '{"state": "running", "pid": "1; rm -rf /"}', ""),
        "odd-metrics": (None, '{"state": "completed"}', '[1, 2]\n"text"\n{"event": "step", "step": "x"}\n'),
    }
    for name, (spec, status, metrics) in bad.items():
        folder = root / name
        (folder / "logs").mkdir(parents=True)
        (folder / "spec.yaml").write_text(spec if spec is not None else RunSpec(name=name).to_yaml())
        (folder / "status.json").write_text(status)
        (folder / "metrics.jsonl").write_text(metrics)
    cli = str(Path(PYTHON).parent / "ortlab")
    listing = subprocess.run([cli, "runs", "--root", str(root)], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    for name in bad:
        assert name in listing.stdout
    compared = subprocess.run([cli, "compare", *bad, "--root", str(root)], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in compared.stderr, compared.stderr
    followed = subprocess.run(
        [cli, "follow", "forged-pid", "--root", str(root)], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in followed.stderr
    assert "failed" in followed.stdout, "a running status with no real process is not followed forever"
    assert Run(root / "odd-metrics").dir.last_step() == 0
