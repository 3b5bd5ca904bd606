"""Planted run folders: what an attacker can put under the runs root, and what ortlab does with it.

The sidebar's Stop and Resume act on every folder under the runs root, and `ortlab runs`, the server and the
workbench show each of them: a folder is input. Each test builds a hostile folder in tmp, acts on it the way a
user would, and asserts that nothing outside the folder changed or leaked, and that the folder is shown as what it
is (`damaged`, with the reason) instead of being trusted. Fast: no model is trained here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest
from fake_runs import make_fake_run

from ortlab import safeio
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run, RunError, runs
from ortlab.spec import RunSpec, SpecError

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- s3cr3t"


def _strict(text: str):
    """json.loads that refuses NaN/Infinity, as a browser's JSON.parse does."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious")
    return path


def planted(root: Path, name: str = "planted", **status) -> RunDir:
    """A run folder as ortlab writes it (spec, logs/, control/), with status.json set to `status` by hand."""
    run = RunDir.create(root, RunSpec.parse({"name": name}))
    if status:
        safeio.write_json(run.path, "status.json", status)
    return run


def fresh_pending(root: Path, name: str = "planted") -> RunDir:
    """A run claimed a moment ago, no process recorded yet: Stop is allowed on it."""
    return planted(root, name, state="pending", updated=time.time())


# --- control files: a stop or pause never writes through a link -----------------------------------------------


def test_stop_replaces_a_linked_control_stop_and_never_writes_through_it(root, victim):
    run = fresh_pending(root)
    os.symlink(victim, run.path / "control" / "stop")
    os.symlink(victim, run.path / "control" / "pause")
    run.request_stop()
    Run(run.path).pause(at_step=3)
    assert victim.read_text() == "precious"
    assert not (run.path / "control" / "stop").is_symlink() and run.stop_requested()
    assert (run.path / "control" / "pause").read_text() == "3"
    Run(run.path).unpause()
    assert victim.exists(), "removing the pause removes the link itself, never its target"


def test_a_linked_control_folder_is_refused_and_nothing_is_written_there(root, tmp_path):
    run = fresh_pending(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run.path / "control").rmdir()
    os.symlink(elsewhere, run.path / "control")
    with pytest.raises(RunError, match=r"control in .* is a link"):
        Run(run.path).stop(timeout=1)
    with pytest.raises(safeio.UnsafePath):
        Run(run.path).pause()
    assert list(elsewhere.iterdir()) == []


def test_a_linked_status_lock_is_never_opened(root, tmp_path):
    run = planted(root, state="running", pid=None, updated=0)  # looks dead: a reader takes the lock to mark it
    target = tmp_path / "not-created"
    (run.path / ".status.lock").unlink()
    os.symlink(target, run.path / ".status.lock")
    status = run.status()
    assert status["state"] == "damaged" and ".status.lock" in status["damaged"]
    assert not target.exists()
    with pytest.raises(safeio.UnsafePath):
        run.set_status("failed")
    assert run.read_status()["state"] == "running", "nothing was written"


def test_a_linked_run_log_gets_no_output(root, victim, monkeypatch):
    import ortlab.runner as runner

    run = fresh_pending(root)
    (run.path / "logs").rmdir()
    (run.path / "logs").mkdir()
    os.symlink(victim, run.path / "logs" / "run.log")
    started = []

    def popen(*args, **kwargs):
        started.append(args)
        raise OSError("the test starts no process")

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    raised: Exception | None = None
    try:
        runner._start(run, RunSpec())
    except (OSError, RunError) as e:
        raised = e
    assert victim.read_text() == "precious", "the launcher appended its command line to the linked file"
    assert started == [] and isinstance(raised, safeio.UnsafePath)


# --- status.json: links, FIFOs, oversized, forged: damaged with a reason ----------------------------------------


def test_a_status_linked_outside_is_damaged_and_left_alone(root, tmp_path):
    outside = tmp_path / "someone-elses-status.json"
    outside.write_text('{"state": "running", "pid": 1}')
    run = planted(root)
    run.status_path.unlink()
    os.symlink(outside, run.status_path)
    status = Run(run.path).status()
    assert status["state"] == "damaged" and "link" in status["damaged"]
    assert [r.id for r in runs(root)] == ["planted"], "listed, so that the user sees it"
    with pytest.raises(RunError, match="damaged"):
        Run(run.path).stop(timeout=1)
    assert outside.read_text() == '{"state": "running", "pid": 1}'


def test_a_fifo_status_is_damaged_without_hanging(root):
    run = planted(root)
    run.status_path.unlink()
    os.mkfifo(run.status_path)
    seen = []
    reader = threading.Thread(target=lambda: seen.append(Run(run.path).status()), daemon=True)
    reader.start()
    reader.join(timeout=60)  # a plain open() of a FIFO blocks until a writer comes: forever
    assert seen, "reading a FIFO status.json hung"
    assert seen[0]["state"] == "damaged" and "regular file" in seen[0]["damaged"]


def test_an_oversized_status_is_damaged_not_read_whole(root):
    run = planted(root)
    with run.status_path.open("w") as f:
        f.write('{"state": "completed", "pad": "')
        f.write("x" * (safeio.MAX_JSON_BYTES + 10))
        f.write('"}')
    status = run.status()
    assert status["state"] == "damaged" and "larger than" in status["damaged"]


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"state": "hacked"}'])
def test_a_status_that_is_not_a_status_is_damaged(root, text):
    run = planted(root)
    run.status_path.write_text(text)
    status = run.status()
    assert status["state"] == "damaged" and "status.json" in status["damaged"]


def test_a_forged_pid_of_a_live_unrelated_process_is_damaged_and_never_signalled(root, monkeypatch):
    import ortlab.runner as runner

    parent = os.getppid()  # alive, and certainly not this run's worker
    run = planted(root, state="running", pid=parent, create_time=process_create_time(parent), updated=time.time())
    status = Run(run.path).status()
    assert status["state"] == "damaged" and f"pid {parent}" in status["damaged"]
    signals = []
    monkeypatch.setattr(runner.os, "killpg", lambda *a: signals.append(a))
    monkeypatch.setattr(runner.os, "kill", lambda *a: signals.append(a))
    with pytest.raises(RunError, match="nothing was signalled"):
        Run(run.path).stop(timeout=1)
    assert signals == [] and not run.stop_requested()
    with pytest.raises(RunError, match="damaged"):
        Run(run.path).resume()
    assert psutil.pid_exists(parent)
    assert run.read_status()["state"] == "running", "a reader never writes over a status it cannot trust"
    # The other side: a run's own process (here this one, holding the run's log open as an in-process run does)
    # is alive and the run's, not damaged.
    mine = make_fake_run(root, "mine", "running", steps=2)
    assert Run(mine).status()["state"] == "running"


# --- spec, result, checkpoints ---------------------------------------------------------------------------------


def test_a_linked_spec_or_result_is_not_read(root, tmp_path):
    from ortlab.server.runindex import RunIndex

    secret_yaml = tmp_path / "secret.yaml"
    secret_yaml.write_text(f"name: x\nmodel: {{name: '{SECRET}'}}\n")
    path = make_fake_run(root, "done", "completed", steps=2)
    run = RunDir(path)
    run.spec_path.unlink()
    os.symlink(secret_yaml, run.spec_path)
    run.result_path.unlink()
    os.symlink(tmp_path / "secret.yaml", run.result_path)
    with pytest.raises(SpecError, match=r"spec\.yaml in .* is a link"):
        RunSpec.from_run(run)
    assert run.result() is None
    detail = RunIndex(root).detail(run)
    assert detail["spec"] is None and "link" in detail["spec_error"]
    assert detail["result"] is None and "link" in detail["result_error"]
    assert SECRET not in json.dumps(detail)


def test_a_linked_checkpoint_is_not_resumed_from(root, tmp_path):
    run = planted(root, state="stopped")
    elsewhere = tmp_path / "checkpoint-99"
    elsewhere.mkdir()
    (elsewhere / "trainer_state.json").write_text("{}")
    run.checkpoints.mkdir()
    os.symlink(elsewhere, run.checkpoints / "checkpoint-99")
    assert run.last_checkpoint() is None
    real = run.checkpoints / "checkpoint-3"
    real.mkdir()
    (real / "trainer_state.json").write_text("{}")
    assert run.last_checkpoint() == real


# --- publishing copies regular files only ----------------------------------------------------------------------


def test_publish_never_copies_what_a_link_points_to(root, tmp_path):
    from ortlab.publish import push_to_folder

    key = tmp_path / "id_rsa"
    key.write_text(SECRET)
    secrets_dir = tmp_path / "private"
    secrets_dir.mkdir()
    (secrets_dir / "token.json").write_text(json.dumps({"token": SECRET}))
    run = RunDir(make_fake_run(root, "done", "completed", steps=2))
    run.model_dir.mkdir()
    (run.model_dir / "config.json").write_text('{"model_type": "bert"}')
    os.symlink(key, run.model_dir / "vocab.txt")
    os.symlink(secrets_dir, run.path / "onnx")
    out = tmp_path / "published"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        push_to_folder(run, out)
    published = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert not any(SECRET in text for text in published.values()), "a linked file's content was published"
    assert sorted(published) == ["README.md", "config.json"]
    from ortlab.publish import PublishWarning

    (warning,) = [str(w.message) for w in said if issubclass(w.category, PublishWarning)]
    assert "model/vocab.txt (a link)" in warning and "onnx (a link" in warning


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_export_and_a_merged_publish_refuse_a_model_folder_with_links(root, tmp_path, linked):
    """Both load model/ by path (transformers follows links) and write what they loaded: a `vocab.txt` linked to a
    key would become the exported or published tokenizer's vocabulary. Refused, naming the link, before loading."""
    from ortlab.export import ExportError, export_onnx
    from ortlab.publish import PublishError, push_to_folder

    key = tmp_path / "id_rsa"
    key.write_text(SECRET)
    run = RunDir(make_fake_run(root, "done", "completed", steps=2))
    run.model_dir.mkdir()
    (run.model_dir / "config.json").write_text('{"model_type": "bert"}')
    (run.model_dir / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    if linked == "file":
        os.symlink(key, run.model_dir / "vocab.txt")
        named = "model/vocab.txt (a link)"
    else:
        os.symlink(tmp_path, run.model_dir / "merged")
        named = "model/merged (a link)"
    with pytest.raises(ExportError, match=r"replace each with the file itself") as refused:
        export_onnx(run)
    assert named in str(refused.value)
    assert not (run.path / "onnx").exists(), "nothing was exported"
    with pytest.raises(PublishError, match=r"replace each with the file itself") as refused:
        push_to_folder(run, tmp_path / "published", merged=True)
    assert named in str(refused.value)
    assert not any((tmp_path / "published").rglob("*")), "nothing was published"


def test_not_regular_names_what_is_not_the_folders_own(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"0")
    assert safeio.not_regular(tmp_path, "model") == [], "a plain folder is the folder's own"
    os.symlink(tmp_path / "elsewhere", model / "sub" / "dangling")
    os.mkfifo(model / "pipe")
    assert safeio.not_regular(tmp_path, "model") == ["model/pipe (not a regular file)", "model/sub/dangling (a link)"]
    assert safeio.not_regular(tmp_path, "absent") == []
    os.symlink(model, tmp_path / "alias")
    assert safeio.not_regular(tmp_path, "alias") == ["alias (a link)"]


def test_a_model_name_cannot_inject_front_matter(root):
    import yaml
    from markdown_it import MarkdownIt

    from ortlab.publish import model_card

    path = make_fake_run(root, "done", "completed", steps=2)
    run = RunDir(path)
    spec = yaml.safe_load(run.spec_path.read_text())
    spec["model"]["name"] = "org/model\n---\nlicense: stolen"
    run.spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match="control character"):
        model_card(run)  # a newline in a name is refused before it reaches the card's front matter
    evil = "org/model --- license: stolen <script>alert(1)</script>`"
    spec["model"]["name"] = evil
    run.spec_path.write_text(yaml.safe_dump(spec))
    card = model_card(run)
    lines = card.split("\n")
    assert lines[0] == "---" and lines.count("---") == 2, card
    front = yaml.safe_load("\n".join(lines[1 : lines.index("---", 1)]))
    assert front["base_model"] == evil and "license" not in front
    body = "\n".join(lines[lines.index("---", 1) + 1 :])
    rendered = MarkdownIt("commonmark").render(body)  # what the Hub does with the card (CommonMark + HTML)
    assert "<script>" not in rendered and "&lt;script&gt;" in rendered


# --- terminal output: escaped -----------------------------------------------------------------------------------


def test_ortlab_runs_shows_markup_in_ids_and_names_as_text(root):
    from typer.testing import CliRunner

    from ortlab.cli import app

    path = make_fake_run(root, "x", "completed", steps=2)
    path = path.rename(root / "[red]x")  # a folder name a spec would refuse, planted by hand
    with (path / "metrics.jsonl").open("a") as f:
        accelerations = {"[/x]": {"requested": True, "applied": True}}
        f.write(json.dumps({"event": "verified", "step": 1, "accelerations": accelerations}) + "\n")
    broken = planted(root, "broken")
    broken.status_path.write_text("[/bold] not json")
    result = CliRunner().invoke(app, ["runs", "--root", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "[red]x" in result.output and "[/x]" in result.output
    assert "damaged" in result.output and "status.json is not JSON" in result.output


# --- what the writers write is JSON ------------------------------------------------------------------------------


def test_a_diverged_runs_metrics_and_result_are_valid_json(tmp_path):
    from ortlab.train.metricswriter import JsonLinesSink

    sink = JsonLinesSink(tmp_path / "metrics.jsonl")
    sink({"event": "train_end", "summary": {"final_loss": math.nan, "peaks": [math.inf, 1.0]}})
    sink.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert _strict(line)["summary"] == {"final_loss": None, "peaks": [None, 1.0]}
    safeio.write_json(tmp_path, "result.json", {"summary": {"final_loss": math.nan}})
    assert _strict((tmp_path / "result.json").read_text()) == {"summary": {"final_loss": None}}


def test_the_metrics_writer_never_appends_through_a_link(tmp_path, victim):
    from ortlab.train.metricswriter import JsonLinesSink

    os.symlink(victim, tmp_path / "metrics.jsonl")
    sink = JsonLinesSink(tmp_path / "metrics.jsonl")
    with contextlib.suppress(safeio.UnsafePath):
        sink({"event": "step"})
    sink.close()
    assert victim.read_text() == "precious"
    with pytest.raises(safeio.UnsafePath, match="link"):
        sink({"event": "step"})


# --- a stop asked for while a resume claims the run is never lost ----------------------------------------------


def test_a_stop_right_after_a_resume_claims_the_run_survives(root, monkeypatch):
    """Deterministic: the stop is asked the moment the claim (`pending`) is written, the earliest any client can
    see it. Before the fix, the resume cleared control/stop after its claim and erased that stop."""
    import ortlab.runfolder.rundir as rundir
    import ortlab.runner as runner

    run = planted(root, state="stopped", step=3)
    ckpt = run.checkpoints / "checkpoint-3"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    run.request_stop()  # the stop that ended it: the resume clears this one
    monkeypatch.setattr(runner, "_start", lambda run_dir, spec, resume=False, cwd=None, hub_token=True: None)
    real_write = safeio.write_json

    def write_then_stop(folder, rel, value, durable=True):
        real_write(folder, rel, value, durable)
        if str(rel) == "status.json" and value.get("state") == "pending":
            RunDir(Path(folder)).request_stop()  # a Stop click that saw the claim

    monkeypatch.setattr(rundir.safeio, "write_json", write_then_stop)
    Run(run.path).resume()
    assert run.read_status()["state"] == "pending"
    assert run.stop_requested(), "the stop asked for after the claim was erased by the resume"


def test_the_cli_says_why_a_planted_folder_is_refused_without_a_traceback_or_escape_codes(root, monkeypatch):
    from typer.testing import CliRunner

    import ortlab.runner as runner
    from ortlab.cli import app

    monkeypatch.setattr(runner, "UNREADABLE_GRACE_S", 0.2)
    parent = os.getppid()
    planted(root, "forged", state="running", pid=parent, create_time=process_create_time(parent), updated=time.time())
    planted(root, "ended", state="failed", error="\x1b]0;pwned\x07\x1b[2J boom")
    cli = CliRunner()
    stopped = cli.invoke(app, ["stop", "forged", "--root", str(root)])
    assert stopped.exit_code == 2 and "nothing was signalled" in stopped.output, stopped.output
    followed = cli.invoke(app, ["follow", "forged", "--root", str(root)])
    assert followed.exit_code == 2 and "not this run's" in followed.output, followed.output
    ended = cli.invoke(app, ["follow", "ended", "--root", str(root)])
    assert "boom" in ended.output and "\x1b" not in ended.output
