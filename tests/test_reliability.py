"""The reliability suite: hostile inputs, faults at any moment, many hands on one runs folder.

It proves three claims with figures, and writes them as a table (test-artifacts/reliability.md, copied into
docs/reliability.md):
- hostile inputs: every one is refused with a clear message before any model loads, with no traceback and
  nothing written outside the runs folder (nor a run folder for it inside);
- faults: kill -9 at seeded random steps, kill -9 in the middle of a checkpoint save, SIGTERM during a save,
  a full disk during a save: the run reads as failed or stopped, every metric line written before the fault
  parses, and resume continues from the last good checkpoint to the end;
- concurrency: 4 runs at once plus watchers (threads and processes) and writers (stop, resume, liveness
  checks) on one runs folder: every status seen is a legal state reached by a legal transition, and every run
  ends completed with each step once.

Runs are real training processes (tiny BERT, CPU). Faults are placed with gates (`Run.pause(at_step=...)`) or
injected into the run process at a named point (`sitecustomize`), never by hoping the machine is fast or slow.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PYTHON, ROOT
from gates import launch_gated, wait_paused
from hostile import refuse_model_loads, refused, spec_with

import ortlab
from ortlab.assets import EMBEDDED_LLM_ID
from ortlab.runfolder.rundir import STATES, TRANSITIONS, RunDir
from ortlab.runner import Run, _start
from ortlab.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.reliability]

REPORT: dict[str, list[dict]] = {"hostile inputs": [], "faults": [], "concurrency": []}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield REPORT
    out = ROOT / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "reliability.json").write_text(json.dumps(REPORT, indent=2))
    (out / "reliability.md").write_text(render(REPORT))


def render(report: dict[str, list[dict]]) -> str:
    lines = [
        "# Reliability: what was tried, what held",
        "",
        "Written by `tests/test_reliability.py` (CI runs it on every change); each row is a case it ran.",
        "",
    ]
    inputs = report["hostile inputs"]
    if inputs:
        ok = sum(r["ok"] for r in inputs)
        lines += [
            f"## Hostile inputs: {ok} of {len(inputs)} refused cleanly",
            "",
            "Each: exit code 2 with a message naming the problem, before any model load, no traceback, nothing "
            "written outside the runs folder, no run folder created.",
            "",
            "| input | refused with |",
            "|---|---|",
        ]
        lines += [f"| {r['case']} | {_cell(r['message'])} |" for r in inputs]
        lines.append("")
    for section in ("faults", "concurrency"):
        rows = report[section]
        if rows:
            lines += [f"## {section.capitalize()}", "", "| case | outcome |", "|---|---|"]
            lines += [f"| {r['case']} | {r['outcome']} |" for r in rows]
            lines.append("")
    return "\n".join(lines)


def _cell(text: str, width: int = 140) -> str:
    text = text.replace("|", "/").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text if len(text) <= width else text[: width - 1].rsplit(" ", 1)[0] + " …"


# --- hostile inputs --------------------------------------------------------------------------------------------


def _files(tmp: Path) -> dict[str, Path]:
    """Bad data and model files, made once per case folder."""
    made = {}

    def write(name: str, text: str | bytes) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
        made[name] = path

    rows = "\n".join(f'"review number {i}",{"pos" if i % 2 else "neg"}' for i in range(30))
    write("empty.csv", "text,label\n")
    write("zero.csv", "")
    write("binary.csv", bytes(range(256)) * 8)
    write("bad.jsonl", '{"text": "a", "label": 1}\n{"text": \n')
    write("data.xyz", "text,label\na,b\n")
    write("ok.csv", "text,label\n" + rows + "\n")
    write("regression.csv", "text,label\n" + "\n".join(f'"t {i}",{i / 7:.3f}' for i in range(30)) + "\n")
    write("oneclass.csv", "text,label\n" + "\n".join(f'"t {i}",same' for i in range(30)) + "\n")
    write("manyclasses.csv", "text,label\n" + "\n".join(f'"t {i}",c{i}' for i in range(3000)) + "\n")
    write("numbers.csv", "text,label\n" + "\n".join(f"{i},{i % 2}" for i in range(30)) + "\n")
    write("emptydir/.keep", "")
    write("model-noconfig/weights.bin", b"\0")
    write("model-badjson/config.json", "{not json")
    write("model-notype/config.json", '{"hidden_size": 8}')
    write("model-unknown/config.json", '{"model_type": "no-such-architecture"}')
    write("list.yaml", "- a\n- b\n")
    write("broken.yaml", "name: [unclosed\n")
    write(
        "cyrillic.csv", "text,label\n" + "\n".join(f'"Съешь же ещё этих мягких булок {i}",{i % 2}' for i in range(30))
    )
    write(
        "empty-text.jsonl",
        "\n".join(json.dumps({"text": "" if i % 4 else "a review", "label": i % 2}) for i in range(30)),
    )
    write(
        "missing-text.csv",
        "text,label\n" + "\n".join("," + str(i % 2) if i == 7 else f"t {i},{i % 2}" for i in range(30)),
    )
    write(
        "missing-label.csv", "text,label\n" + "\n".join(f"t {i}," + ("" if i == 5 else str(i % 2)) for i in range(30))
    )
    write("short.txt", "to be\nor not\n")
    write("chat-strings.jsonl", "\n".join(json.dumps({"messages": ["Is it fresh?", "fresh"]}) for _ in range(20)))
    write("model-t5/config.json", '{"model_type": "t5", "is_encoder_decoder": true}')
    write("model.gguf", b"GGUF? no: a few bytes")
    write("model.safetensors", b"\0" * 64)
    return made


def _broken_models(tmp: Path, tiny_bert: Path, tiny_gpt2: Path) -> dict[str, Path]:
    """Copies of the tiny models with one thing wrong, as a user would make them by hand."""

    def copy(source: Path, name: str, drop: tuple[str, ...] = (), **config) -> Path:
        folder = tmp / name
        shutil.copytree(source, folder)
        for file in drop:
            (folder / file).unlink()
        if config:
            (folder / "config.json").write_text(
                json.dumps({**json.loads((folder / "config.json").read_text()), **config})
            )
        return folder

    no_pad = copy(tiny_gpt2, "gpt2-no-eos")
    settings = json.loads((no_pad / "tokenizer_config.json").read_text())
    (no_pad / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in settings.items() if "_token" not in k}))
    return {
        "no-tokenizer": copy(tiny_bert, "bert-no-tokenizer", drop=("tokenizer.json", "tokenizer_config.json")),
        "bigger-embeddings": copy(tiny_bert, "bert-8000-rows", vocab_size=8000),
        "smaller-embeddings": copy(tiny_bert, "bert-500-rows", vocab_size=500),
        "no-pad": no_pad,
    }


def hostile_cases(
    f: dict[str, Path], tiny_bert: Path, broken: dict[str, Path], tiny_gpt2: Path
) -> list[tuple[str, dict | Path, str]]:
    """(what, spec or spec file, a word the message must contain)."""
    m = str(tiny_bert)
    ok = {"model": {"name": m}, "data": {"source": str(f["ok.csv"])}}

    def with_(**kw: Any) -> dict:
        return spec_with(ok, **kw)

    return [
        ("run name escaping the root (`../../x`)", with_(name="../../x"), "name"),
        ("run name as an absolute path", with_(name="/tmp/owned"), "name"),
        ("run name with a newline", with_(name="a\nb"), "name"),
        ("run name with HTML", with_(name="<img src=x onerror=alert(1)>"), "name"),
        ("run name of 101 characters", with_(name="x" * 101), "name"),
        ("model folder that does not exist", with_(model__name="./no-such-model"), "model.name"),
        ("model folder without config.json", with_(model__name=str(f["model-noconfig/weights.bin"].parent)), "config"),
        ("model config.json that is not JSON", with_(model__name=str(f["model-badjson/config.json"].parent)), "JSON"),
        ("model config.json without model_type", with_(model__name=str(f["model-notype/config.json"].parent)), "type"),
        (
            "model config.json with an unknown architecture",
            with_(model__name=str(f["model-unknown/config.json"].parent)),
            "no-such",
        ),
        ("Hub model id while offline", with_(model__name="someone/some-model"), "model.name"),
        ("data file that does not exist", with_(data__source="./missing.csv"), "does not exist"),
        ("data folder without data files", with_(data__source=str(f["emptydir/.keep"].parent)), "no data files"),
        ("CSV with a header and no rows", with_(data__source=str(f["empty.csv"])), "empty"),
        ("CSV of zero bytes", with_(data__source=str(f["zero.csv"])), "data"),
        ("CSV of binary garbage", with_(data__source=str(f["binary.csv"])), "data"),
        ("JSON lines cut in the middle", with_(data__source=str(f["bad.jsonl"])), "data"),
        ("data file with an unknown suffix", with_(data__source=str(f["data.xyz"])), "format"),
        ("unknown embedded dataset", with_(data__source="embedded:nope"), "nope"),
        ("text column that does not exist", with_(data__text_column="body"), "body"),
        ("label column that does not exist", with_(data__label_column="stars"), "stars"),
        ("numbers as the text column", with_(data__source=str(f["numbers.csv"])), "not text"),
        ("fractional labels (a regression target)", with_(data__source=str(f["regression.csv"])), "fractional"),
        ("a single class", with_(data__source=str(f["oneclass.csv"])), "at least 2"),
        ("3,000 distinct labels", with_(data__source=str(f["manyclasses.csv"])), "distinct labels"),
        ("token classification on whole texts", with_(task="token-classification"), "word lists"),
        ("causal LM with a label column", with_(task="causal-lm", data__label_column="label"), "label_column"),
        ("unknown task", with_(task="summarise-everything"), "task"),
        ("eval split that does not exist", with_(data__eval_split="validation"), "eval_split"),
        ("train split that does not exist", with_(data__train_split="training"), "train_split"),
        ("learning rate 0", with_(hyper__learning_rate=0), "learning_rate"),
        ("negative epochs", with_(hyper__epochs=-1), "epochs"),
        ("batch size 0", with_(hyper__batch_size=0), "batch_size"),
        ("batch size as text", with_(hyper__batch_size="big"), "batch_size"),
        ("max length 100,000", with_(hyper__max_length=100_000), "max_length"),
        ("ZeRO stage 5", with_(accel__zero_stage=5), "zero_stage"),
        ("ORT with torch.compile", with_(accel__ort=True, accel__torch_compile=True), "torch_compile"),
        ("fp16 on a machine without CUDA", with_(accel__precision="fp16"), "fp16"),
        ("0 processes", with_(target__processes=0), "processes"),
        ("a misspelt field", with_(hyperr={"lr": 1}), "unknown field"),
        ("target interpreter that does not exist", with_(target__python="/nonexistent/python3"), "target.python"),
        ("cluster address with a password in it", with_(target__cluster="http://ray:pw@127.0.0.1:8265"), "credentials"),
        (
            "storage URI whose '..' segments lead to another bucket",
            with_(target__cluster="local", target__storage="s3://allowed/runs/../../other/x"),
            "segment",
        ),
        ("file:// storage on another host", with_(target__cluster="local", target__storage="file://nas/runs"), "file"),
        ("ZeRO stage 3 with several processes", with_(accel__zero_stage=3, target__processes=2), "ZeRO stage 3"),
        ("spec file that is a YAML list", f["list.yaml"], "mapping"),
        ("spec file that is not valid YAML", f["broken.yaml"], "YAML"),
        # The model and the data each fine alone, but not together (ortlab.fit): tokenizer, positions, padding.
        (
            "model folder without its tokenizer files (transformers would build an empty one)",
            with_(model__name=str(broken["no-tokenizer"])),
            "no tokenizer files",
        ),
        (
            "another model's tokenizer: 2,000 tokens for 8,000 embedding rows",
            with_(model__name=str(broken["bigger-embeddings"])),
            "not the tokenizer this model was trained with",
        ),
        (
            "a tokenizer larger than the embedding matrix (2,000 tokens, 500 rows)",
            with_(model__name=str(broken["smaller-embeddings"])),
            "have no embedding",
        ),
        (
            "text the tokenizer cannot read (Cyrillic through an English WordPiece)",
            with_(data__source=str(f["cyrillic.csv"])),
            "% of the",
        ),
        ("max_length 4096 on a model with 128 positions", with_(hyper__max_length=4096), "positions for 128"),
        (
            "decoder tokenizer with neither pad nor end-of-sequence token, for classification",
            with_(model__name=str(broken["no-pad"])),
            "no pad token",
        ),
        (
            "LoRA on a layer the model does not have",
            with_(adapter={"kind": "lora", "target_modules": ["nope"]}),
            "query",
        ),
        (
            "LoRA on the classifier head alone",
            with_(adapter={"kind": "lora", "target_modules": ["classifier"]}),
            "dense, key, query, value",
        ),
        ("text column of mostly empty strings", with_(data__source=str(f["empty-text.jsonl"])), "empty"),
        ("a text cell missing in a CSV", with_(data__source=str(f["missing-text.csv"])), "first: row 7"),
        ("a label cell missing in a CSV", with_(data__source=str(f["missing-label.csv"])), "first: row 5"),
        (
            "a T5 (encoder-decoder) model for causal-lm",
            with_(task="causal-lm", model__name=str(f["model-t5/config.json"].parent)),
            "no causal-lm head",
        ),
        ("a GGUF file as the model", with_(model__name=str(f["model.gguf"])), "is a GGUF file"),
        ("a weights file as the model", with_(model__name=str(f["model.safetensors"])), "is a file"),
        (
            "causal LM text shorter than one block of max_length",
            with_(task="causal-lm", model__name=str(tiny_gpt2), data__source=str(f["short.txt"])),
            "one block",
        ),
        (
            "chat messages that are strings, for the embedded SmolLM2 (refused before its 20-40 s conversion)",
            with_(task="causal-lm", model__name=EMBEDDED_LLM_ID, data__source=str(f["chat-strings.jsonl"])),
            "needs a 'role' and a 'content'",
        ),
    ]


def test_hostile_inputs_are_refused_before_any_model_loads(tiny_bert, tiny_gpt2, tmp_path, monkeypatch, capfd):
    import torch

    import ortlab.assets

    # Weights never load, and the embedded LLM is not converted from GGUF, in a cache of this test's own.
    refuse_model_loads(monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    monkeypatch.chdir(tmp_path)
    files = _files(tmp_path / "inputs")
    cases = hostile_cases(files, tiny_bert, _broken_models(tmp_path / "models", tiny_bert, tiny_gpt2), tiny_gpt2)
    assert len(cases) >= 30
    failures = []
    for i, (what, spec, word) in enumerate(cases):
        if "fp16" in what and torch.cuda.is_available():
            continue
        if "SmolLM2" in what and ortlab.assets.embedded_llm_gguf() is None:
            continue  # without its package the id is a Hub id, refused as offline before the data is read
        case = tmp_path / f"case-{i}"
        case.mkdir()
        runs = case / "runs"
        if isinstance(spec, dict):
            spec_file = case / "spec.yaml"
            spec_file.write_text(yaml.safe_dump({**spec, "output_dir": str(runs)}))
        else:
            spec_file = spec
        args = ["train", str(spec_file), "--output-dir", str(runs), "--quiet"]
        message, problems = refused(args, runs, word, tmp_path, case, capfd)
        if (cache / "models").exists():
            problems.append("the embedded LLM's folder was made")
        shown = message.split("error: ")[-1].removeprefix("invalid run spec: - ")
        shown = shown.replace(str(tmp_path), "TMP").replace(str(tiny_bert), "TINY-BERT")
        shown = shown.replace(str(tiny_gpt2), "TINY-GPT2")
        REPORT["hostile inputs"].append({"case": what, "message": shown, "ok": not problems})
        if problems:
            failures.append(f"{what}: {'; '.join(problems)}\n    output: {message[:300]}")
    assert not failures, "\n".join(failures)


# --- faults ------------------------------------------------------------------------------------------------------


@pytest.fixture
def spec_for(tiny_bert, tmp_path):
    def make(name: str, root: Path | None = None, max_steps: int = 16, save_steps: int | None = 4) -> RunSpec:
        return RunSpec.parse(
            {
                "name": name,
                "output_dir": str(root or tmp_path / "runs"),
                "model": {"name": str(tiny_bert)},
                "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 2000, "max_eval_samples": 16},
                "hyper": {
                    "learning_rate": 1e-3,
                    "batch_size": 8,
                    "max_length": 32,
                    "max_steps": max_steps,
                    "save_steps": save_steps,
                },
                "accel": {"ort": False, "fused_adam": False},
            }
        )

    return make


def metrics_lines_parse(run: Run) -> int:
    """Every complete line of metrics.jsonl is JSON (a line torn by the fault may be the last one only)."""
    raw = run.dir.metrics_path.read_bytes()
    lines = raw.split(b"\n")
    for line in lines[:-1]:
        if line:
            json.loads(line)
    return len([x for x in lines[:-1] if x])


def steps_of(run: Run) -> list[int]:
    return [r["step"] for r in run.metrics() if r["event"] == "step"]


def finish_after_resume(run: Run, expect_from: int, max_steps: int) -> None:
    run.resume().wait(timeout=400)
    status = run.status()
    assert status["state"] == "completed", (status, run.dir.log_path.read_text()[-3000:])
    resumed = [r for r in run.metrics() if r["event"] == "resume"]
    assert resumed[-1]["step"] == expect_from, (resumed, "resume starts at the last good checkpoint")
    after = steps_of(run)[-(max_steps - expect_from) :]
    assert after == list(range(expect_from + 1, max_steps + 1))
    assert run.result()["summary"]["steps"] == max_steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_at_a_random_step_then_resume(spec_for, seed):
    k = random.Random(seed).randint(5, 13)
    run = launch_gated(spec_for(f"kill-{seed}"), at_step=k)
    wait_paused(run)
    os.killpg(run.status()["pid"], signal.SIGKILL)
    status = run.wait(timeout=60)
    assert status["state"] == "failed" and "killed" in status["error"]
    lines = metrics_lines_parse(run)
    assert steps_of(run) == list(range(1, k + 1))
    good = run.dir.last_checkpoint()
    assert good is not None and good.name == f"checkpoint-{k // 4 * 4}"
    finish_after_resume(run, k // 4 * 4, 16)
    REPORT["faults"].append(
        {
            "case": f"kill -9 at step {k} (seed {seed})",
            "outcome": f"failed ('{status['error'][:60]}...'); {lines} metric lines intact; resumed from "
            f"{good.name} to completed at step 16",
        }
    )


def _inject(tmp_path: Path, code: str, monkeypatch) -> None:
    inject = tmp_path / "inject"
    inject.mkdir(exist_ok=True)
    (inject / "sitecustomize.py").write_text(textwrap.dedent(code))
    monkeypatch.setenv("PYTHONPATH", str(inject))


SAVE_HOOK = """
    import os, signal
    from transformers import Trainer
    original = Trainer._save_checkpoint
    def _save_checkpoint(self, model, trial):
        if self.state.global_step == 8 and not os.environ.get("ORTLAB_TEST_FAULT_DONE"):
            os.environ["ORTLAB_TEST_FAULT_DONE"] = "1"
            {action}
        return original(self, model, trial)
    Trainer._save_checkpoint = _save_checkpoint
"""


def test_kill_9_in_the_middle_of_a_checkpoint_save(spec_for, tmp_path, monkeypatch):
    # Killed after the model weights of checkpoint-8 are written but before the trainer state: a half-made
    # checkpoint that resume must not take.
    action = (
        "self.save_model(os.path.join(self.args.output_dir, 'checkpoint-8'), _internal_call=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    _inject(tmp_path, SAVE_HOOK.format(action=action), monkeypatch)
    run = ortlab.launch(spec_for("kill-in-save").model_dump(mode="json"))
    status = run.wait(timeout=300)
    assert status["state"] == "failed", status
    monkeypatch.delenv("PYTHONPATH")
    half = run.dir.checkpoints / "checkpoint-8"
    assert half.is_dir() and not (half / "trainer_state.json").exists(), "the save was cut in the middle"
    assert run.dir.last_checkpoint().name == "checkpoint-4"
    lines = metrics_lines_parse(run)
    finish_after_resume(run, 4, 16)
    REPORT["faults"].append(
        {
            "case": "kill -9 in the middle of checkpoint-8's save",
            "outcome": f"failed; half-written checkpoint-8 skipped; {lines} metric lines intact; resumed from "
            "checkpoint-4 to completed",
        }
    )


def test_sigterm_during_a_checkpoint_save_stops_gracefully(spec_for, tmp_path, monkeypatch):
    _inject(tmp_path, SAVE_HOOK.format(action="os.kill(os.getpid(), signal.SIGTERM)"), monkeypatch)
    run = ortlab.launch(spec_for("term-in-save").model_dump(mode="json"))
    status = run.wait(timeout=300)
    monkeypatch.delenv("PYTHONPATH")
    assert status["state"] == "stopped", (status, run.dir.log_path.read_text()[-2000:])
    assert (run.dir.checkpoints / "checkpoint-8" / "trainer_state.json").exists(), "the save in progress finished"
    stopped_at = status["step"]
    assert stopped_at == 9, "the stop comes at the end of the next step"
    assert run.dir.last_checkpoint().name == "checkpoint-9"
    lines = metrics_lines_parse(run)
    finish_after_resume(run, 9, 16)
    assert steps_of(run) == list(range(1, 17)), "a graceful stop loses no step and repeats none"
    REPORT["faults"].append(
        {
            "case": "SIGTERM during checkpoint-8's save",
            "outcome": f"save finished, stopped at step 9 with checkpoint-9; {lines} metric lines intact; resumed "
            "to completed, each step once",
        }
    )


def test_a_full_disk_during_a_save(spec_for, tmp_path):
    # A real full disk: the run's checkpoints folder is a small tmpfs, filled up while the run waits at its gate.
    spec = spec_for("full-disk")
    run = Run(RunDir.create(spec.output_dir, spec).path)
    mount = run.dir.checkpoints
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        run.pause(at_step=7)
        run._process = _start(run.dir, spec)
        wait_paused(run)
        filler = mount / "filler"
        filler.write_bytes(b"\0" * (shutil.disk_usage(mount).free - 64 * 1024))  # 64 KiB left: no checkpoint fits
        run.unpause()
        status = run.wait(timeout=300)
        assert status["state"] == "failed", status
        assert "No space left on device" in status["error"], status
        lines = metrics_lines_parse(run)
        assert steps_of(run) == list(range(1, 9))
        assert run.dir.last_checkpoint().name == "checkpoint-4", "the checkpoint cut by the full disk is skipped"
        filler.unlink()
        finish_after_resume(run, 4, 16)
        REPORT["faults"].append(
            {
                "case": "disk full during checkpoint-8's save (a real, filled tmpfs)",
                "outcome": f"failed with 'No space left on device'; {lines} metric lines intact; after freeing "
                "space, resumed from checkpoint-4 to completed",
            }
        )
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# --- concurrency ------------------------------------------------------------------------------------------------


def test_four_runs_with_watchers_and_writers_on_one_folder(spec_for, tmp_path):
    root = tmp_path / "shared-runs"
    specs = [spec_for(f"c{i}", root=root, max_steps=12, save_steps=None) for i in range(4)]
    gated = launch_gated(specs[0], at_step=4)  # c0 is stopped at a known step, then resumed by 3 processes at once
    others = [ortlab.launch(s.model_dump(mode="json")) for s in specs[1:]]
    bad: list[str] = []
    done = threading.Event()
    watched: list[dict[str, list[str]]] = []  # one history per watcher thread

    def watch() -> None:
        # Each watcher checks the states it saw itself, in the order it read them: a history shared by the three
        # threads took one thread's older read ("running") after another's newer one ("completed") for a step back.
        seen: dict[str, list[str]] = {}
        watched.append(seen)
        while not done.is_set():
            for run in ortlab.runs(root):
                state = run.status()["state"]  # a liveness check: a writer too
                history = seen.setdefault(run.id, [])
                if not history or history[-1] != state:
                    previous = history[-1] if history else None
                    if state not in STATES or (previous and state not in TRANSITIONS[previous]):
                        bad.append(f"{run.id}: {previous} -> {state}")
                    history.append(state)
                run.metrics()
            time.sleep(0.05)

    watchers = [threading.Thread(target=watch) for _ in range(3)]
    for t in watchers:
        t.start()
    cli = str(Path(PYTHON).parent / "ortlab")
    poll = (
        f"import ortlab, time\nfor _ in range(200):\n"
        f"    [r.status() for r in ortlab.runs({str(root)!r})]\n    time.sleep(0.05)"
    )
    outside = [subprocess.Popen([PYTHON, "-c", poll]) for _ in range(2)]
    try:
        wait_paused(gated)
        stop_status = gated.stop(timeout=120)
        # Held before step 5: a stop lets that step finish (as any stop finishes its step), then saves and exits.
        assert stop_status["state"] == "stopped" and stop_status["step"] == 5, stop_status
        barrier = tmp_path / "go"
        script = textwrap.dedent(
            f"""
            import os, time, ortlab
            from ortlab.runner import RunError
            while not os.path.exists({str(barrier)!r}):
                time.sleep(0.01)
            try:
                ortlab.attach("c0", root={str(root)!r}).resume()
                print("STARTED")
            except RunError as e:
                print("REFUSED", e)
            """
        )
        resumers = [subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        time.sleep(2)
        barrier.write_text("go")
        answers = [p.communicate(timeout=120)[0].strip() for p in resumers]
        assert sum(a.startswith("STARTED") for a in answers) == 1, answers
        for run in [gated, *others]:
            status = run.wait(timeout=600)
            assert status["state"] == "completed", (run.id, status, run.dir.log_path.read_text()[-2000:])
            assert steps_of(run) == list(range(1, 13)), (run.id, steps_of(run))
            assert [r["phase"] for r in run.metrics() if r["event"] == "eval"] == ["before", "after"]
        listing = subprocess.run([cli, "runs", "--root", str(root)], capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0
    finally:
        done.set()
        for t in watchers:
            t.join()
        for p in outside:
            p.kill()
            p.wait()
    assert not bad, bad
    histories = [history for seen in watched for history in seen.values()]
    assert len(watched) == 3 and len(histories) == 3 * 4, watched
    assert all(history[-1] == "completed" for history in histories), watched
    REPORT["concurrency"].append(
        {
            "case": "4 runs at once; 3 watcher threads and 2 watcher processes reading every status (each read is "
            "a liveness check that may write); one run stopped at a gate and resumed by 3 processes at once",
            "outcome": f"every status seen legal ({sum(map(len, histories))} state changes seen by 3 threads); "
            f"exactly 1 of 3 resumes started; all 4 runs completed with each of their 12 steps once",
        }
    )
