"""`ortlab train`: bad input fails fast and leaves no run behind; every task trains end to end from YAML."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON

ORTLAB = str(Path(PYTHON).parent / "ortlab")


def ortlab(*args: str, timeout: int = 900, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([ORTLAB, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad-data")
    files = {
        "numbers.csv": "text,label\n" + "".join(f"{i},{i % 2}\n" for i in range(20)),
        "empty.csv": "text,label\n",
        "floats.csv": "text,label\n" + "".join(f"review {i},{i / 7:.3f}\n" for i in range(20)),
        "one_class.csv": "text,label\n" + "".join(f"review {i},good\n" for i in range(20)),
        "good.csv": "text,label\n" + "".join(f"review number {i},{'good' if i % 2 else 'bad'}\n" for i in range(20)),
    }
    for name, text in files.items():
        (d / name).write_text(text)
    (d / "garbage.parquet").write_bytes(b"\x00\x01 this is not parquet \xff" * 10)
    return {name: d / name for name in [*files, "garbage.parquet"]}


BAD = [
    ("model-folder-missing", ["--model", "./no/such/model"], "does not exist"),
    ("hub-model-offline", ["--model", "nobody/no-such-model-xyz"], "Hub is not reachable"),
    ("data-file-missing", ["--data", "./missing.csv"], "does not exist"),
    ("data-unreadable", ["--data", "{garbage.parquet}"], "could not read"),
    ("label-column-missing", ["--data", "{good.csv}", "--label-column", "stars"], "no column 'stars'"),
    ("text-column-missing", ["--data", "{good.csv}", "--text-column", "body"], "no column 'body'"),
    ("text-not-text", ["--data", "{numbers.csv}"], "is not text"),
    ("empty-dataset", ["--data", "{empty.csv}"], "is empty"),
    ("labels-are-regression", ["--data", "{floats.csv}"], "fractional numbers"),
    ("labels-one-class", ["--data", "{one_class.csv}"], "at least 2"),
    ("unknown-task", ["--task", "summarization"], "task:"),
    ("learning-rate-zero", ["--lr", "0"], "hyper.learning_rate"),
    ("batch-size-zero", ["--batch-size", "0"], "hyper.batch_size"),
    ("impossible-mix", ["--precision", "fp16", "--ort"], "fp16 needs a CUDA device"),
    ("spec-file-missing", ["./no-such-spec.yaml"], "does not exist"),
    ("zero3-several-processes", ["--zero-stage", "3", "--processes", "2"], "ZeRO stage 3 across several processes"),
    ("storage-dot-dot", ["--cluster", "local", "--storage", "s3://runs/a/../../other"], "'..' segment"),
    ("storage-file-host", ["--cluster", "local", "--storage", "file://server/runs"], "file:///shared/runs"),
]


@pytest.mark.parametrize(("args", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_fails_fast_and_leaves_no_run(tmp_path, bad_files, args, expected):
    import torch

    if "fp16" in args and torch.cuda.is_available():
        pytest.skip("fp16 is possible here")
    args = [str(bad_files[a[1:-1]]) if a.startswith("{") else a for a in args]
    out = tmp_path / "runs"
    proc = ortlab("train", *args, "--output-dir", str(out), "--quiet", cwd=tmp_path, timeout=180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expected in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    # Before anything expensive: no model loaded, nothing tokenized (what a time limit stood for, without the clock).
    assert "loading the model" not in proc.stdout + proc.stderr
    assert "tokenizing" not in proc.stdout + proc.stderr
    assert not out.exists() or not any(out.iterdir()), "a failed check must not leave a run folder"


def test_an_output_folder_that_is_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    args = ["--output-dir", str(blocker / "sub"), "--max-steps", "1", "--quiet"]
    proc = ortlab("train", *args, cwd=tmp_path, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"the output folder {blocker / 'sub'} is a file, or a file is in its path" in proc.stderr, proc.stderr
    assert "loading the model" not in proc.stdout + proc.stderr
    assert blocker.read_text() == "not a folder"


def test_the_launcher_switch_alone_says_where_a_run_trains(tmp_path):
    """`ortlab train` trains in its own process exactly when `launcher_for(spec, here=True)` gives the foreground
    launcher (one process, this interpreter); several processes, another Python or a cluster are launched, and so
    is every run of a caller that does not wait for it in this process (a notebook's `launch`, the server)."""
    import sys

    from ortlab.runner import launcher_for
    from ortlab.runner.foreground import Foreground
    from ortlab.runner.local import Local
    from ortlab.runner.rayjob import RayJob
    from ortlab.runner.raytrainjob import RayTrain
    from ortlab.spec import RunSpec

    def kind(here: bool, **target) -> type:
        return type(launcher_for(RunSpec.parse({"target": target}), here=here))

    assert kind(True) is Foreground and kind(True, python=sys.executable) is Foreground
    assert kind(False) is Local
    assert kind(True, processes=2) is Local
    other = tmp_path / "python3"
    assert kind(True, python=str(other)) is Local
    assert kind(True, cluster="local") is RayJob and kind(True, cluster="local", processes=2) is RayTrain
    assert not hasattr(__import__("ortlab.runner").runner, "trains_here"), "one switch, not a second condition"


def test_a_foreground_run_asked_to_stop_says_how_to_resume(tmp_path, monkeypatch):
    """A foreground run stopped from outside (`ortlab stop`, SIGTERM) ends with its checkpoint; the command says
    how to continue it (it printed a KeyError traceback: the result table of a finished run was asked of it)."""
    from typer.testing import CliRunner

    from ortlab.cli import app

    def stopped(run, **kwargs) -> dict:
        run_dir = tmp_path / "runs" / "halted"  # what `execute` returns for a run that stopped
        return {
            "stopped": True,
            "step": 3,
            "checkpoint": str(run_dir / "checkpoints" / "checkpoint-3"),
            "run_dir": str(run_dir),
        }

    monkeypatch.setattr("ortlab.runner.foreground.Foreground.preflight", lambda self, spec: None)
    monkeypatch.setattr("ortlab.runner.foreground.execute", stopped)
    out = CliRunner().invoke(app, ["train", "--output-dir", str(tmp_path / "runs"), "--quiet"])
    assert out.exit_code == 0, out.output
    assert f"stopped: continue it with: ortlab resume halted --root {tmp_path / 'runs'}" in out.output


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "launched"])
def test_a_cli_run_checks_its_model_and_data_once(tmp_path, monkeypatch, detach):
    """The input check (`ortlab.fit.check_model_and_data`: the model and the data, 13-20 s) runs once per run: in the
    foreground's preflight, whose answer the start trains on, or in a launched run's own process. The command checked a
    launched run itself as well, before `launch`, so its data was loaded twice. Here the run process is this one (the
    local launcher's start runs `execute` in place) and training is cut short: every check of the run is counted."""
    from typer.testing import CliRunner

    from ortlab.cli import app
    from ortlab.lifecycle.execute import execute

    checks: list[str] = []

    def check(spec, log=print):
        checks.append(spec.data.source)
        return spec.model.name, None

    def halted(spec, run, *args) -> dict:  # what `_train` returns for a run asked to stop before its first step
        return {"stopped": True, "step": 0, "checkpoint": "", "run_dir": str(run.path)}

    def start_here(self, run, spec, resume=False, cwd=None, hub_token=True):
        execute(run, resume=resume, progress=False, log=lambda line: None)  # the run process's part, in place

    for where in ("ortlab.fit.check_model_and_data", "ortlab.lifecycle.execute.check_model_and_data"):
        monkeypatch.setattr(where, check)
    monkeypatch.setattr("ortlab.lifecycle.execute._train", halted)
    monkeypatch.setattr("ortlab.runner.local.Local.preflight", lambda self, spec: {})
    monkeypatch.setattr("ortlab.runner.local.Local.start", start_here)
    args = ["train", "--output-dir", str(tmp_path / "runs"), "--quiet", *(["--detach"] if detach else [])]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert len(checks) == 1, f"the model and data were checked {len(checks)} times for one run"
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "status.json").read_text())["state"] == "stopped"


def test_train_and_tune_map_their_options_to_the_spec_through_one_table():
    import inspect

    from ortlab.cli import options, train
    from ortlab.spec import RunSpec

    fields = RunSpec().model_dump(mode="json")
    for name, option in options.SPEC_OPTIONS.items():
        node = fields
        for key in option.path[:-1]:
            assert isinstance(node.get(key), dict), f"--{name} sets {'.'.join(option.path)}: no spec section {key!r}"
            node = node[key]
        assert option.path[-1] in node, f"--{name} sets {'.'.join(option.path)}, which the RunSpec does not have"
    # every option of either command is in the table, or is the command's own (not a spec field)
    own = {
        "train": {"spec_file", "quiet", "verbose", "detach"},
        "tune_cmd": {"spec_file", "cache", "compile", "json_out"},
    }
    for command, not_spec in own.items():
        unmapped = set(inspect.signature(getattr(train, command)).parameters) - not_spec - set(options.SPEC_OPTIONS)
        assert not unmapped, f"{command} has options that set no spec field: {unmapped}"
    given = {"model": "m", "data": None, "lora": False, "tune": True, "report_to": ["a,b", "c"], "quiet": True}
    assert options.overrides(given) == {
        ("model", "name"): "m",
        ("data", "source"): None,
        ("accel", "tune"): "measure",
        ("adapter", "kind"): "none",
        ("report_to",): ["a", "b", "c"],
    }


@pytest.mark.parametrize("command", ["train", "tune"])
def test_spec_options_help_is_the_spec_fields_description(command):
    """--help shows each field's own description (and a Literal field's choices): a description changed in
    ortlab/spec.py shows in --help, with no second copy to forget."""
    from typer.testing import CliRunner

    from ortlab.cli import app, options
    from ortlab.spec import TASKS

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    shown = "".join(result.output.split())  # click wraps (and breaks at hyphens): compare without whitespace
    checked = 0
    for name, option in options.SPEC_OPTIONS.items():
        if command == "tune" and name not in ("model", "data", "task", "batch_size", "max_length"):
            continue
        description = options.spec_field(option.path).description
        assert description, f"{'.'.join(option.path)} has no description for --help"
        assert "".join(description.split()) in shown, f"--help of {command} lost {name}'s description:\n{description}"
        assert "".join(f"[{'.'.join(option.path)}".split()) in shown
        checked += 1
    assert checked >= 5
    assert "One of: " + ", ".join(TASKS) in " ".join(result.output.split()).replace("- ", "-")


def test_a_changed_field_description_is_the_new_help(monkeypatch):
    from typer.testing import CliRunner

    from ortlab.cli import app
    from ortlab.spec import HyperSpec

    monkeypatch.setattr(HyperSpec.model_fields["learning_rate"], "description", "How big each optimizer step is.")
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "How big each optimizer step is. [hyper.learning_rate;" in " ".join(result.output.split())


def _train_yaml(tmp_path: Path, spec: dict) -> dict:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = ortlab("train", str(path), "--quiet")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = Path(spec["output_dir"]) / spec["name"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert (run_dir / "model" / "config.json").exists()
    assert (run_dir / "model" / "tokenizer.json").exists()
    assert yaml.safe_load((run_dir / "spec.yaml").read_text())["task"] == spec["task"]
    return json.loads((run_dir / "result.json").read_text())


@pytest.mark.slow
def test_sequence_classification_from_yaml(tmp_path, tiny_bert):
    result = _train_yaml(
        tmp_path,
        {
            "name": "cls",
            "output_dir": str(tmp_path / "runs"),
            "task": "sequence-classification",
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 320, "max_eval_samples": 64},
            "hyper": {"learning_rate": 1e-3, "batch_size": 16, "max_length": 64},
            "accel": {"ort": True, "fused_adam": True},
        },
    )
    assert result["label_names"] == ["fresh", "rotten"]
    assert {"eval_accuracy", "eval_f1"} <= set(result["eval_after"])
    assert result["accelerations"]["ort"]["applied"]
    assert result["summary"]["steps"] == 20


@pytest.mark.slow
def test_token_classification_from_yaml(tmp_path, tiny_bert):
    result = _train_yaml(
        tmp_path,
        {
            "name": "ner",
            "output_dir": str(tmp_path / "runs"),
            "task": "token-classification",
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:synthetic-ner", "max_train_samples": 640, "max_eval_samples": 128},
            "hyper": {"learning_rate": 3e-3, "batch_size": 16, "max_length": 48},
            "accel": {"ort": True},
        },
    )
    assert result["label_names"] == ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]
    before, after = result["eval_before"], result["eval_after"]
    assert after["eval_f1"] > before["eval_f1"] + 0.3, (before, after)
    assert result["accelerations"]["ort"]["applied"]


@pytest.mark.slow
def test_causal_lm_from_yaml(tmp_path, tiny_gpt2):
    result = _train_yaml(
        tmp_path,
        {
            "name": "clm",
            "output_dir": str(tmp_path / "runs"),
            "task": "causal-lm",
            "model": {"name": str(tiny_gpt2)},
            "data": {"source": "embedded:hamlet", "max_train_samples": 2000, "max_eval_samples": 400},
            "hyper": {"learning_rate": 3e-3, "batch_size": 8, "max_length": 64},
            "accel": {"ort": True},
        },
    )
    before, after = result["eval_before"], result["eval_after"]
    assert after["eval_perplexity"] < before["eval_perplexity"] / 2, (before, after)
    assert result["accelerations"]["ort"]["applied"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(Path(result["run_dir"]) / "model")
    assert model.config.use_cache is True


@pytest.mark.slow
def test_embedded_default_learns(tmp_path):
    # The README's main command runs exactly this job. Chance (majority class) is about 0.58.
    proc = ortlab("train", "--output-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["eval_after"]["eval_accuracy"] > 0.70, result["eval_after"]
    assert result["eval_after"]["eval_accuracy"] > result["eval_before"]["eval_accuracy"] + 0.1
    assert "accuracy" in proc.stdout
