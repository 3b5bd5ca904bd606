"""Export to ONNX with parity and latency; publishing to a folder, a git remote, and the Hub (a local test
double speaking the Hub's HTTP API to the real huggingface_hub client)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON

from ortlab.publish import card_text

ORTLAB = str(Path(PYTHON).parent / "ortlab")
pytestmark = pytest.mark.slow
TOKEN = "hf_test_token_7d1c0ffee"


@pytest.fixture(scope="module")
def finished(tiny_bert, tiny_gpt2, tmp_path_factory) -> dict[str, Path]:
    """One completed run per task, trained through the CLI."""
    root = tmp_path_factory.mktemp("finished-runs")
    specs = {
        "sequence-classification": (tiny_bert, "embedded:rotten-tomatoes"),
        "token-classification": (tiny_bert, "embedded:synthetic-ner"),
        "causal-lm": (tiny_gpt2, "embedded:hamlet"),
    }
    runs = {}
    for task, (model, data) in specs.items():
        spec = {
            "name": task,
            "output_dir": str(root),
            "task": task,
            "model": {"name": str(model)},
            "data": {
                "source": data,
                "max_train_samples": 160,
                "max_eval_samples": 400 if task == "causal-lm" else 40,
            },  # lines -> 32-token blocks
            "hyper": {"learning_rate": 1e-3, "batch_size": 16, "max_length": 32, "max_steps": 6},
            "accel": {"ort": True},
        }
        path = root / f"{task}.yaml"
        path.write_text(yaml.safe_dump(spec))
        proc = subprocess.run(
            [ORTLAB, "train", str(path), "--quiet"],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_TOKEN": TOKEN},  # a user's token is in the environment
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert TOKEN not in proc.stdout + proc.stderr
        runs[task] = root / task
    return runs


@pytest.mark.parametrize("task", ["sequence-classification", "token-classification", "causal-lm"])
def test_export_agrees_with_pytorch(finished, task):
    from ortlab.export import MAX_ABS_DIFF, export_onnx

    report = export_onnx(finished[task], samples=32, quantize=True)
    assert report.good
    fp32 = report.variants["fp32"]
    assert fp32.max_abs_diff < MAX_ABS_DIFF
    assert fp32.agreement == 1.0
    # A causal LM is exported with its KV cache (the default): its greedy generation is timed per token too.
    timed = {"batch_1", "batch_16"} | ({"per_token"} if task == "causal-lm" else set())
    assert set(fp32.latency_ms) == timed
    assert set(report.pytorch_latency_ms) == timed
    if task == "causal-lm":
        assert fp32.generation_agreement == 1.0
    assert report.variants["int8"].agreement >= 0.9
    saved = json.loads((finished[task] / "onnx" / "export.json").read_text())
    assert saved["good"] is True
    assert (finished[task] / "onnx" / "model.onnx").stat().st_size > 10_000
    if task != "causal-lm":
        assert fp32.accuracy == report.pytorch_accuracy


def test_cli_export_prints_the_latency_comparison(finished):
    proc = subprocess.run(
        [ORTLAB, "export", str(finished["sequence-classification"]), "--optimize"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PyTorch" in proc.stdout
    assert "batch 16" in proc.stdout
    assert "speed-up" in proc.stdout
    assert "optimized" in proc.stdout


def test_an_export_that_does_not_match_is_not_marked_good(finished, tmp_path, monkeypatch):
    import torch

    from ortlab.export import export_onnx

    run = tmp_path / "copy"
    shutil.copytree(finished["sequence-classification"], run)
    real_export = torch.onnx.export

    def export_a_different_model(model, *args, **kwargs):
        import copy

        broken = copy.deepcopy(model)
        with torch.no_grad():
            for p in broken.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        return real_export(broken, *args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export_a_different_model)
    report = export_onnx(run, samples=32)
    assert not report.good
    assert report.variants["fp32"].max_abs_diff > 1e-3
    assert json.loads((run / "onnx" / "export.json").read_text())["good"] is False


def test_only_completed_runs_export_or_publish(finished, tmp_path):
    from ortlab import safeio
    from ortlab.export import ExportError, export_onnx
    from ortlab.publish import PublishError, push_to_folder
    from ortlab.runfolder.rundir import RunDir

    run = tmp_path / "unfinished"
    shutil.copytree(finished["sequence-classification"], run)
    safeio.write_json(
        RunDir(run).path, "status.json", {"state": "stopped", "step": 3}
    )  # a copy of a run that was stopped
    with pytest.raises(ExportError, match="only a completed run"):
        export_onnx(run)
    with pytest.raises(PublishError, match="only a completed run"):
        push_to_folder(run, tmp_path / "out")


def test_push_to_folder_and_git_remote(finished, tmp_path):
    from ortlab.export import export_onnx
    from ortlab.publish import push_to_folder, push_to_git

    run = finished["sequence-classification"]
    if not (run / "onnx").exists():
        export_onnx(run, samples=16)
    out = push_to_folder(run, tmp_path / "published")
    names = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "onnx/model.onnx"} <= names
    assert not any("optimizer" in n or "checkpoint" in n or "training_args" in n for n in names)

    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    push_to_git(run, str(bare))
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "-b", "main", bare.as_uri(), str(clone)], check=True)
    lfs = subprocess.run(["git", "lfs", "ls-files", "-n"], cwd=clone, capture_output=True, text=True, check=True)
    assert "model.safetensors" in lfs.stdout
    assert "onnx/model.onnx" in lfs.stdout
    for name in ("model.safetensors", "onnx/model.onnx", "README.md"):
        assert (clone / name).read_bytes() == (out / name).read_bytes()


def test_overwrite_only_replaces_an_earlier_publish(finished, tmp_path):
    from ortlab.publish import PublishError, push_to_folder

    precious = tmp_path / "home-like"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(PublishError, match="not written by ortlab"):
        push_to_folder(finished["sequence-classification"], precious, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "years of work"
    out = push_to_folder(finished["sequence-classification"], tmp_path / "release")
    assert push_to_folder(finished["sequence-classification"], out, overwrite=True) == out


def test_git_remote_is_never_taken_as_an_option(finished, tmp_path):
    from ortlab.publish import PublishError, push_to_git

    marker = tmp_path / "executed"
    with pytest.raises(PublishError):
        push_to_git(finished["sequence-classification"], f"--upload-pack=touch {marker}")
    assert not marker.exists()


def test_a_failed_re_export_keeps_the_previous_one(finished, monkeypatch):
    import torch

    from ortlab.export import export_onnx

    run = finished["sequence-classification"]
    if not (run / "onnx").exists():
        export_onnx(run, samples=16)
    before = (run / "onnx" / "model.onnx").read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("export failed half-way")

    monkeypatch.setattr(torch.onnx, "export", broken)
    with pytest.raises(RuntimeError, match="half-way"):
        export_onnx(run, samples=16)
    assert (run / "onnx" / "model.onnx").read_bytes() == before
    assert json.loads((run / "onnx" / "export.json").read_text())["variants"]["fp32"]["good"]
    assert not [p for p in run.iterdir() if p.name.startswith(".onnx")], "no temporary folder left behind"


# --- the Hub: the real huggingface_hub client against FakeHub (tests/helpers/fake_hub.py) -----------------------


def hub_env(hub, tmp_path: Path, token: str | None = TOKEN) -> dict[str, str]:
    return hub.client_env(tmp_path / "hf-home", token=token)


def push(run: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([ORTLAB, "push", str(run), *extra], capture_output=True, text=True, timeout=300, env=env)


def test_push_to_hub_then_download_and_load(finished, tmp_path):
    from fake_hub import FakeHub

    from ortlab.export import export_onnx

    run = finished["sequence-classification"]
    if not (run / "onnx").exists():
        export_onnx(run, samples=16)
    with FakeHub(token=TOKEN) as hub:
        env = hub_env(hub, tmp_path)
        proc = push(run, env, "--repo", "me/tiny-classifier", "--private")
        assert proc.returncode == 0, proc.stderr[-3000:]
        held = hub.files("me/tiny-classifier")
        assert hub.repo("me/tiny-classifier")["private"] is True
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "onnx/model.onnx"} <= set(held)
        assert not [n for n in held if "optimizer" in n or "checkpoint" in n or "training_args" in n]
        assert not any(TOKEN.encode() in data for data in held.values()), "the token must never be uploaded"
        assert "model.safetensors" in hub.repo("me/tiny-classifier")["lfs"]
        assert held["model.safetensors"] == (run / "model" / "model.safetensors").read_bytes()
        card = held["README.md"].decode()
        result = json.loads((run / "result.json").read_text())
        applied = [k for k, v in result["accelerations"].items() if v["applied"]]
        # (names from the run folder's result.json are made inert: `fused_adam` is `fused&#95;adam` in the Markdown)
        assert f"accelerations that applied (verified during the run): {card_text(', '.join(applied))}" in card
        assert "ort" in applied
        assert f"{result['summary']['steady_samples_per_s']:.2f} samples/s" in card
        assert "passed the parity check" in card

        # Download with the real client into a fresh folder: identical bytes, and the model loads from there.
        down = tmp_path / "downloaded"
        script = textwrap.dedent(
            """
            import sys
            from huggingface_hub import snapshot_download
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
            path = snapshot_download("me/tiny-classifier", local_dir=sys.argv[1])
            model = AutoModelForSequenceClassification.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
            print("LOADED", type(model).__name__, model.config.num_labels, len(tokenizer))
            """
        )
        got = subprocess.run([PYTHON, "-c", script, str(down)], capture_output=True, text=True, env=env, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
        assert "LOADED BertForSequenceClassification 2" in got.stdout
        for name, data in held.items():
            assert (down / name).read_bytes() == data, name

        # Pushing again into the same repo needs --overwrite.
        again = push(run, env, "--repo", "me/tiny-classifier")
        assert again.returncode == 2
        assert "already exists" in again.stderr
        assert "--overwrite" in again.stderr
        assert push(run, env, "--repo", "me/tiny-classifier", "--overwrite").returncode == 0


def test_no_token_and_no_local_path_leaves_the_machine(finished, tmp_path, tmp_path_factory):
    """The token was in the training environment and is in the pushing one; a checkpoint carries a pickled
    TrainingArguments that holds it (as a user's hub_token would): none of it, and no local path, is uploaded,
    printed or written into the run folder."""
    import torch
    from fake_hub import FakeHub
    from transformers import TrainingArguments

    run = tmp_path / "with-checkpoint"
    shutil.copytree(finished["sequence-classification"], run)
    checkpoint = run / "checkpoints" / "checkpoint-6"
    shutil.copytree(run / "model", checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    torch.save(TrainingArguments(output_dir=str(run), hub_token=TOKEN, report_to=[]), checkpoint / "training_args.bin")
    assert TOKEN.encode() in (checkpoint / "training_args.bin").read_bytes()

    with FakeHub(token=TOKEN) as hub:
        proc = push(run, hub_env(hub, tmp_path), "--repo", "me/leak-check", "--include-checkpoints")
        assert proc.returncode == 0, proc.stderr[-3000:]
        held = hub.files("me/leak-check")
    assert any(name.startswith("checkpoints/") for name in held), "checkpoints were asked for"
    assert not [n for n in held if n.endswith("training_args.bin")]
    # Every test folder (the run, the tiny model it was trained from) lives under pytest's base folder.
    local = [str(tmp_path_factory.getbasetemp()), str(Path.home()) + "/"]
    for name, data in held.items():
        assert TOKEN.encode() not in data, name
        for path in local:
            assert path.encode() not in data, (name, path)
    assert TOKEN not in proc.stdout + proc.stderr
    for f in run.rglob("*"):
        if f.is_file() and f != checkpoint / "training_args.bin":
            assert TOKEN.encode() not in f.read_bytes(), f


def test_push_errors_offline_without_token_and_with_a_bad_token(finished, tmp_path):
    from fake_hub import FakeHub

    run = finished["sequence-classification"]
    with FakeHub(token=TOKEN) as hub:
        offline = push(run, {**hub_env(hub, tmp_path), "HF_HUB_OFFLINE": "1"}, "--repo", "me/x")
        assert offline.returncode == 2
        assert "offline mode is on" in offline.stderr
        no_token = push(run, hub_env(hub, tmp_path, token=None), "--repo", "me/x")
        assert no_token.returncode == 2
        assert "no Hugging Face token" in no_token.stderr
        bad = push(run, hub_env(hub, tmp_path, token="hf_wrong"), "--repo", "me/x")
        assert bad.returncode == 2
        assert "401" in bad.stderr
        with pytest.raises(KeyError):
            hub.files("me/x")  # nothing was created
