"""Experiment trackers (ortlab.trackers): a real run through the CLI logs to trackio and TensorBoard, offline and
inside its run folder, with ortlab's requested and applied mix as the run's config; their files are read back
with each tracker's own format (TensorBoard's EventAccumulator, trackio's SQLite store)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON

ORTLAB = str(Path(PYTHON).parent / "ortlab")
LOGGED_STEPS = [2, 4, 6]


@pytest.fixture(scope="module")
def tracked_run(tiny_gpt2, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path]:
    root = tmp_path_factory.mktemp("tracked")
    spec = {
        "name": "tracked",
        "task": "causal-lm",
        "model": {"name": str(tiny_gpt2)},
        "data": {"source": "embedded:hamlet", "max_train_samples": 120, "max_eval_samples": 60},
        "hyper": {"learning_rate": 1e-3, "batch_size": 8, "max_length": 32, "max_steps": 6, "logging_steps": 2},
        "accel": {"ort": False, "tune": "off"},
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    home = root / "home"  # where trackio and the Hub client would write by default: must stay empty
    proc = subprocess.run(
        [ORTLAB, "train", str(root / "spec.yaml"), "--report-to", "trackio,tensorboard", "--output-dir", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "tracked", proc, home


@pytest.mark.slow  # the tracked run (a CLI process) takes ~25 s
def test_tensorboard_holds_the_logged_steps_and_the_mix(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _, _ = tracked_run
    folder = run / "trackers" / "tensorboard"
    assert list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == LOGGED_STEPS
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["loss"] for r in metrics if r.get("event") == "log" and "loss" in r}
    for e in events.Scalars("train/loss"):
        assert e.value == pytest.approx(logged[e.step], rel=1e-5)  # the same numbers as ortlab's own stream
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    applied = json.loads(texts["ortlab/applied_mix/text_summary"][0].tensor_proto.string_val[0])
    result = json.loads((run / "result.json").read_text())
    assert applied == {k: v["applied"] for k, v in result["accelerations"].items()}
    args = texts["args/text_summary"][0].tensor_proto.string_val[0].decode()
    assert '"requested_mix"' in args and '"report_to"' in args


@pytest.mark.slow
def test_trackio_stores_the_logged_steps_and_the_mix_locally(tracked_run):
    run, proc, home = tracked_run
    db = run / "trackers" / "trackio" / "ortlab.db"
    with sqlite3.connect(db) as c:
        rows = [json.loads(m) for (m,) in c.execute("select metrics from metrics where run_name = 'tracked'")]
        (config,) = [json.loads(cfg) for (cfg,) in c.execute("select config from configs where run_name = 'tracked'")]
    assert sorted(r["train/global_step"] for r in rows if "train/loss" in r) == LOGGED_STEPS
    assert [r["train/global_step"] for r in rows if "eval/loss" in r] == [0, 6]  # before and after training
    ours = config["ortlab_config"]
    assert ours["spec"]["report_to"] == ["trackio", "tensorboard"]
    assert ours["requested_mix"]["ort"] is False
    applied = json.loads((run / "result.json").read_text())["accelerations"]
    assert ours["applied_mix"] == {k: v["applied"] for k, v in applied.items()}
    assert not (home / "trackio").exists()  # nothing outside the run folder
    assert "Trackio" not in proc.stdout + proc.stderr  # its chatter went to the run's log
    assert "trained: every weight" in proc.stdout  # the summary says what trained, in parameters


def test_trackers_are_checked_before_launch(monkeypatch, tmp_path):
    from ortlab.runner import RunError, preflight
    from ortlab.spec import RunSpec, SpecError
    from ortlab.trackers import environment

    with pytest.raises(SpecError, match=r"report_to.*'comet' is not a tracker.*trackio, tensorboard, mlflow, wandb"):
        RunSpec.parse({"report_to": ["comet"]})
    for name in ("mlflow", "wandb"):
        if find_spec(name) is None:
            spec = RunSpec.parse({"report_to": ["tensorboard", name]})  # a description: any machine may have it
            with pytest.raises(RunError, match=f"needs the {name} package.*pip install {name}"):
                preflight(spec)  # the launch's preflight, in the interpreter the run would use
    assert RunSpec.parse({"report_to": ["trackio", "trackio"]}).report_to == ["trackio"]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = environment(["wandb", "mlflow"], tmp_path)
    assert env["WANDB_MODE"] == "offline" and env["MLFLOW_TRACKING_URI"].startswith("file://")
    monkeypatch.setenv("WANDB_MODE", "online")  # a user's own choice wins
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    env = environment(["wandb", "mlflow"], tmp_path)
    assert env["WANDB_MODE"] == "online" and "MLFLOW_TRACKING_URI" not in env
