"""Hostile inputs, round three (issue #48): the surfaces of the last two waves, each refused in ortlab's own words.

Four surfaces, each case through the face a user would use:
- the CLI (`ortlab train`, `ortlab resume`): spec fields, storage spellings, data paths (links, FIFOs, devices, CSVs
  that do not parse, chat answers cut off on the lazy and streamed paths), spec files that would explode a reader;
  exit code 2, the expected words, no traceback, no run folder, nothing written outside the runs folder, and no
  model weights loaded (loads are patched to fail the case);
- the server's routes (a real jupyter_server): every query value and body in ortlab's words, a 4xx and never a 500;
- the notebook (`Run.resume`, `Run.bring_home`) on planted run folders: RunError, and nothing of another run
  touched (compared byte for byte).

One test runs them all and writes the table to test-artifacts/hostile-round3.md; docs/reliability.md carries it,
and the same test keeps the two in step. A last test reads a planted run folder whose every
file is a few KB of the worst kind with every reader ortlab has, each within 1 s of CPU and 100 MB.
"""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import test_server
import yaml
from conftest import ROOT
from fake_runs import make_fake_run
from hostile import cli, refuse_model_loads, refused, spec_with
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the server's fixtures, for this module only)

from ortlab.runfolder.place import new_place
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run, RunError, trust
from ortlab.runner.trust import STORAGES_ENV
from ortlab.spec import RunSpec

# A real Jupyter server with ortlab's extension, its runs root in the test's folder: test_server's fixtures.
Api = test_server.Api
runs_root, jp_server_config, api = test_server.runs_root, test_server.jp_server_config, test_server.api
DOC = ROOT / "docs" / "reliability.md"
TITLE = "## Hostile inputs, round three"


def render(rows: list[dict[str, Any]]) -> str:
    ok = sum(r["ok"] for r in rows)
    lines = [
        f"{TITLE}: {ok} of {len(rows)} refused cleanly",
        "",
        "Written by `tests/test_hostile_round3.py` (issue #48): the surfaces of the last two waves, each case "
        "through the face a user would use. CLI: exit code 2, no traceback, no run folder, nothing written outside "
        "the runs folder, no model weights loaded. Server: a 4xx in ortlab's words, never a 500. Notebook: "
        "RunError, and another run's files unchanged byte for byte.",
        "",
        "| surface | input | refused with |",
        "|---|---|---|",
    ]
    lines += [f"| {r['surface']} | {r['case']} | {_cell(r['message'])} |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(text: str, width: int = 150) -> str:
    text = " ".join(text.split()).replace("|", "/").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("`", "'")
    return text if len(text) <= width else text[: width - 1].rsplit(" ", 1)[0] + " …"


def _row(rows: list[dict], surface: str, case: str, message: str, problems: list[str], tmp: Path) -> str | None:
    shown = message.split("error: ")[-1].removeprefix("invalid run spec: - ").replace(str(tmp), "TMP")
    shown = re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/' ]+", "TMP", shown)  # (the session's models)
    rows.append({"surface": surface, "case": case, "message": shown, "ok": not problems})
    return f"{surface} / {case}: {'; '.join(problems)}\n    got: {message[:300]}" if problems else None


# --- the CLI ---------------------------------------------------------------------------------------------------

LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{','.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


def _inputs(tmp: Path, outside: Path) -> dict[str, Path]:
    """The files the CLI cases name, made once."""
    tmp.mkdir(parents=True)
    rows = [f"review number {i},{'pos' if i % 2 else 'neg'}" for i in range(3100)]
    made = {"ok.csv": tmp / "ok.csv", "quote.csv": tmp / "quote.csv", "fields.csv": tmp / "fields.csv"}
    made["ok.csv"].write_text("text,label\n" + "\n".join(rows[:30]) + "\n")
    quoted = list(rows)
    quoted[2999] = '"an opening quote that never closes,pos'  # (line 3001, the header being line 1)
    made["quote.csv"].write_text("text,label\n" + "\n".join(quoted) + "\n")
    fields = rows[:30]
    fields[5] = "a,b,c"  # line 7
    made["fields.csv"].write_text("text,label\n" + "\n".join(fields) + "\n")
    os.mkfifo(tmp / "pipe.csv")
    made["pipe.csv"] = tmp / "pipe.csv"
    (tmp / "linked" / "part").mkdir(parents=True)
    (tmp / "linked" / "mine.csv").write_text("text,label\n" + "\n".join(rows[:30]) + "\n")
    outside.mkdir(parents=True)
    (outside / "elsewhere.csv").write_text("text,label\n" + "\n".join(rows[30:60]) + "\n")
    (tmp / "linked" / "part" / "borrowed.csv").symlink_to(outside / "elsewhere.csv")
    made["linked"] = tmp / "linked"
    for name, cut_every, count in (("chat-cut.jsonl", 1, 60), ("chat-cut-stream.jsonl", 1, 1200)):
        lines = []
        for i in range(count):
            prompt = ("very " * 80 if i % cut_every == 0 else "") + f"is review {i} fresh?"
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "fresh"}]
            lines.append(json.dumps({"messages": turns}))
        made[name] = tmp / name
        made[name].write_text("\n".join(lines) + "\n")
    made["laughs.yaml"] = tmp / "laughs.yaml"
    made["laughs.yaml"].write_text(LAUGHS.replace("a: &a", "x: &a", 1) + "hyper: {batch_size: *i}\n")
    made["deep.yaml"] = tmp / "deep.yaml"
    made["deep.yaml"].write_text("hyper: " + "[" * 200 + "]" * 200 + "\n")
    made["big.yaml"] = tmp / "big.yaml"
    made["big.yaml"].write_text("name: run\n# " + "x" * (2 << 20) + "\n")
    made["binary.yaml"] = tmp / "binary.yaml"
    made["binary.yaml"].write_bytes(bytes(range(256)) * 16)
    made["specdir"] = tmp / "specdir.yaml"
    made["specdir"].mkdir()
    made["output-file"] = tmp / "output-file"
    made["output-file"].write_text("a file, not a folder\n")
    return made


def _yaml(case: Path, text: str) -> Path:
    path = case / "spec.yaml"
    path.write_text(text)
    return path


def cli_cases(f: dict[str, Path], tiny_bert: Path, tiny_chat_llama: Path) -> list[tuple[str, Any, list[str], str]]:
    """(what, a spec (dict), YAML text or a spec file, extra CLI arguments, a word the message must hold)."""
    ok = {"model": {"name": str(tiny_bert)}, "data": {"source": str(f["ok.csv"])}}

    def with_(**kw: Any) -> dict:
        return spec_with(ok, **kw)

    head = f"model: {{name: '{tiny_bert}'}}\ndata: {{source: '{f['ok.csv']}'"
    chat = {
        "task": "causal-lm",
        "model": {"name": str(tiny_chat_llama)},
        "hyper": {"max_length": 48, "max_steps": 4, "batch_size": 2},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},
    }
    local = {"target__cluster": "local"}
    return [
        # spec fields
        ("`data.lazy: yes` (YAML 1.1's boolean word)", head + ", lazy: yes}\n", [], "write true or false"),
        ("`accel.ort: on`", head + "}\naccel: {ort: on}\n", [], "write true, false or 'auto'"),
        ("`accel.tcmalloc: 1`", with_(accel__tcmalloc=1), [], "write true, false or 'auto'"),
        ("`target.start_timeout_s: 30` without a cluster", with_(target__start_timeout_s=30), [], "cluster run"),
        ("`target.cpus_per_process: 4` without a cluster", with_(target__cpus_per_process=4), [], "cluster run"),
        ("`hyper.learning_rate: .inf`", head + "}\nhyper: {learning_rate: .inf}\n", [], "finite number"),
        ("`hyper.epochs: .nan`", head + "}\nhyper: {epochs: .nan}\n", [], "finite number"),
        ("`hyper.batch_size: '²'` (a digit that is not ASCII)", with_(hyper__batch_size="²"), [], "integer"),
        ("`hyper.batch_size: '٣'` (an Arabic-Indic three)", with_(hyper__batch_size="٣"), [], "integer"),
        ("`hyper.max_steps` of 5,000 digits", with_(hyper__max_steps="9" * 5000), [], "integer"),
        ("a NUL in `model.name`", with_(model__name=f"{tiny_bert}\0x"), [], "control character"),
        ("a newline in `data.source`", with_(data__source=f"{f['ok.csv']}\nrm -rf ~"), [], "control character"),
        ("a NUL in a LoRA target module", with_(adapter={"kind": "lora", "target_modules": ["q\0"]}), [], "control"),
        # spec files that would explode a reader
        ("spec file of YAML aliases (a billion strings from 400 bytes)", f["laughs.yaml"], [], "alias"),
        ("spec file nested 200 deep", f["deep.yaml"], [], "deep"),
        ("spec file of 2 MiB", f["big.yaml"], [], "larger than"),
        ("spec file of binary bytes", f["binary.yaml"], [], "spec"),
        ("spec file that is a folder", f["specdir"], [], "not a regular file"),
        # storage spellings
        ("storage whose path hides `..` as `%2e%2e`", with_(**local, target__storage="s3://b/runs/%2e%2e/x"), [], ".."),
        ("storage with an empty path segment", with_(**local, target__storage="s3://b//x"), [], "segment"),
        ("storage with a key and secret", with_(**local, target__storage="s3://AKIA:SECRET@b/x"), [], "credentials"),
        ("storage with a secret in its query", with_(**local, target__storage="s3://b/x?secret_key=abc"), [], "query"),
        ("storage without a bucket", with_(**local, target__storage="s3:///x"), [], "no bucket"),
        ("storage of an unknown scheme (`ftp://`)", with_(**local, target__storage="ftp://h/x"), [], "ftp://"),
        (
            "storage whose endpoint carries `user:secret@` after a scheme",
            with_(**local, target__storage="s3://b/x?endpoint_override=http://u:SECRET@minio:9000"),
            [],
            "credentials",
        ),
        (
            "storage whose endpoint carries `USER:SECRET@host` without a scheme",
            with_(**local, target__storage="s3://b/x?endpoint_override=USER:SECRET@minio:9000"),
            [],
            "credentials",
        ),
        ("storage URI ending in a newline", with_(**local, target__storage="s3://b/x\n"), [], "control character"),
        ("cluster address `javascript:alert(1)`", with_(target__cluster="javascript:alert(1)"), [], "Ray Jobs"),
        ("cluster address `file:///etc/passwd`", with_(target__cluster="file:///etc/passwd"), [], "Ray Jobs"),
        # data paths
        ("a FIFO as `--data`", with_(), ["--data", str(f["pipe.csv"])], "not a regular file"),
        ("`/dev/null` as `--data`", with_(), ["--data", "/dev/null"], "not a regular file"),
        ("a data folder with a link to a file elsewhere", with_(data__source=str(f["linked"])), [], "not its own"),
        ("a CSV quote opened on line 3001 and never closed", with_(data__source=str(f["quote.csv"])), [], "3001"),
        ("a CSV line of 3 fields under a 2-column header", with_(data__source=str(f["fields.csv"])), [], "line 7"),
        (
            "the same CSV, streamed (`data.streaming: true`)",
            with_(data__source=str(f["fields.csv"]), data__streaming=True),
            [],
            "line 7",
        ),
        (
            "chat whose every answer is cut off by max_length, lazy path",
            {**chat, "data": {"source": str(f["chat-cut.jsonl"]), "lazy": True}},
            [],
            "nothing to learn",
        ),
        (
            "chat whose every answer is cut off by max_length, streamed path",
            {**chat, "data": {"source": str(f["chat-cut-stream.jsonl"]), "streaming": True}},
            [],
            "nothing to learn",
        ),
        ("`--output-dir` that is a file", with_(), ["--output-dir", str(f["output-file"])], "is a file"),
        ("a data path of 5,000 characters", with_(data__source="d/" * 2500), [], "File name too long"),
    ]


def _cli_part(rows: list[dict], tiny_bert: Path, tiny_chat_llama: Path, tmp_path: Path, monkeypatch, capfd) -> list:
    tmp_path.mkdir(parents=True, exist_ok=True)
    refuse_model_loads(monkeypatch)
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    files = _inputs(tmp_path / "inputs", tmp_path / "outside")
    failures = []
    for i, (what, spec, extra, word) in enumerate(cli_cases(files, tiny_bert, tiny_chat_llama)):
        case = tmp_path / f"case-{i}"
        case.mkdir()
        runs = case / "runs"
        if isinstance(spec, dict):
            spec_file = _yaml(case, yaml.safe_dump({**spec, "output_dir": str(runs)}))
        elif isinstance(spec, str):
            spec_file = _yaml(case, spec)
        else:
            spec_file = spec
        out = [] if "--output-dir" in extra else ["--output-dir", str(runs)]
        message, problems = refused(
            ["train", str(spec_file), *out, *extra, "--quiet"], runs, word, tmp_path, case, capfd
        )
        failures.append(_row(rows, "CLI", what, message, problems, tmp_path))
    return failures


# --- the server ------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def nothing_named(monkeypatch):
    """No storage listed or named in this process: every planted storage is one the user never named."""
    monkeypatch.delenv(STORAGES_ENV, raising=False)
    monkeypatch.setattr(trust, "_named_here", set())


def _victim(storage: Path) -> RunDir:
    """Another run's place in a storage folder: stopped, with a model, a result and a checkpoint."""
    remote = new_place(storage, "exp-1", b"name: exp-1\n")
    remote.set_status("stopped", step=3)
    remote.model_dir.mkdir()
    (remote.model_dir / "config.json").write_text('{"secret": "the victim\'s model"}')
    remote.result_path.write_text(json.dumps({"summary": {"steps": 3}}))
    _checkpoint(remote, "checkpoint-3")
    return remote


def _checkpoint(run: RunDir, name: str) -> None:
    (run.checkpoints / name).mkdir(parents=True)
    (run.checkpoints / name / "trainer_state.json").write_text("{}")


def _planted(root: Path, name: str, checkpoint: str = "checkpoint-3", **target: str) -> RunDir:
    """A stopped run folder with one checkpoint whose spec names `target`: a folder anyone could have put there."""
    run = RunDir.create(root, RunSpec.parse({"name": name, "target": target}))
    run.set_status("stopped", step=3)
    _checkpoint(run, checkpoint)
    return run


def _borrowing(root: Path, victim: RunDir) -> RunDir:
    """A planted folder named as the victim, naming its storage, its status naming the victim's place."""
    run = _planted(root, victim.id, cluster="local", storage=str(victim.path.parent))
    run.update_status(launcher={"kind": "ray-job", "cluster": "local", "job_id": "x", "storage": str(victim.path)})
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _server_part(rows: list[dict], api: Api, runs_root: Path, tmp_path: Path) -> list:
    make_fake_run(runs_root, "live", "running", steps=3)
    victim = _victim(tmp_path / "shared")
    before = _files(victim.path)
    _borrowing(runs_root, victim)
    _planted(runs_root, "planted-store", cluster="local", storage="s3://someone-elses-bucket/runs")
    _planted(runs_root, "superscript", checkpoint="checkpoint-²")
    laughs = RunDir.create(runs_root, RunSpec(name="laughs"))
    (laughs.path / "spec.yaml").write_text(LAUGHS.replace("a: &a", "x: &a", 1) + "hyper: {batch_size: *i}\n")
    metrics = "runs/live/metrics?"
    cases = [
        ("`offset=²` (a digit that is not ASCII)", "GET", metrics + "offset=%C2%B2", None, 400, "offset must be"),
        ("`offset` of 5,000 digits", "GET", metrics + "offset=" + "9" * 5000, None, 400, "offset must be"),
        ("`offset=-1`", "GET", metrics + "offset=-1", None, 400, "offset must be"),
        ("`offset=' 3'` (a space first)", "GET", metrics + "offset=%203", None, 400, "offset must be"),
        ("`max_points=0`", "GET", metrics + "max_points=0", None, 400, "max_points must be"),
        ("`max_points=٣`", "GET", metrics + "max_points=%D9%A3", None, 400, "max_points must be"),
        ("`max_points` of a billion", "GET", metrics + "max_points=1000000000", None, 400, "max_points must be"),
        ("a run id that climbs out (`..%2F..%2Fetc`)", "GET", "runs/..%2F..%2Fetc", None, 404, "no run"),
        ("a new run with `data.lazy: \"yes\"`", "POST", "runs", {"data": {"lazy": "yes"}}, 400, "true or false"),
        ("a new run with `hyper.learning_rate: \"inf\"`", "POST", "runs", {"hyper": {"learning_rate": "inf"}}, 400,
         "finite"),
        ("a new run with `start_timeout_s` and no cluster", "POST", "runs", {"target": {"start_timeout_s": 30}}, 400,
         "cluster run"),
        ("a new run whose model name holds a NUL", "POST", "runs", {"model": {"name": "a\0b"}}, 400, "control"),
        ("a new run whose body is a JSON list", "POST", "runs", [1, 2], 400, "JSON object"),
        ("resume of a planted folder naming another run's storage folder", "POST", f"runs/{victim.id}/resume", None,
         409, "names the storage folder"),
        ("resume of a planted folder naming an unlisted object store", "POST", "runs/planted-store/resume", None, 409,
         "names the object store"),
        ("resume of a run whose only checkpoint is `checkpoint-²`", "POST", "runs/superscript/resume", None, 409,
         "no checkpoint"),
        ("the detail of a run whose spec.yaml is 400 bytes of aliases", "GET", "runs/laughs", None, 200, "alias"),
    ]  # fmt: skip
    failures = []
    for what, method, path, body, code, word in cases:
        got, answer, _ = api(method, path, body)
        if code == 200:
            message = json.dumps(answer)
        else:  # (a refused spec: "invalid run spec" and its problems, as everywhere)
            message = "; ".join([answer.get("message", ""), *answer.get("problems", [])]) if answer else str(answer)
        problems = [] if got == code else [f"HTTP {got}, expected {code}"]
        if word.lower() not in str(message).lower():
            problems.append(f"message lacks {word!r}")
        if any(w in str(message) for w in ("Traceback", "invalid literal", "Exceeds the limit")):
            problems.append("Python's words")
        if code == 200:
            message = answer.get("spec_error") or message
        failures.append(_row(rows, "server", what, f"{got}: {message}", problems, tmp_path))
    if _files(victim.path) != before:
        failures.append("server: the victim's remote place changed")
    return failures


# --- the notebook ----------------------------------------------------------------------------------------------


def _notebook_part(rows: list[dict], tmp_path: Path, capfd) -> list:
    root = tmp_path / "runs"
    victim = _victim(tmp_path / "shared")
    before = _files(victim.path)
    borrowing = _borrowing(root, victim)
    store = _planted(root, "planted-store", cluster="local", storage="s3://someone-elses-bucket/runs")
    superscript = _planted(root, "superscript", checkpoint="checkpoint-²")
    cases = [
        ("`Run.bring_home()` of a folder naming another run's storage folder", borrowing, "bring_home",
         "names the storage folder"),
        ("`Run.resume()` of the same folder", borrowing, "resume", "names the storage folder"),
        ("`Run.resume(cluster='local')` of the same folder", borrowing, "resume-local", "names the storage folder"),
        ("`Run.resume()` of a folder naming an unlisted object store", store, "resume", "names the object store"),
        ("`Run.resume()` of a run whose only checkpoint is `checkpoint-²`", superscript, "resume", "no checkpoint"),
    ]  # fmt: skip
    failures = []
    for what, planted, action, word in cases:
        run = Run(planted.path)
        status = planted.status_path.read_bytes()
        try:
            if action == "bring_home":
                run.bring_home()
            else:
                run.resume(**({"cluster": "local"} if action == "resume-local" else {}))
            message, problems = "(nothing raised)", ["not refused"]
        except RunError as e:
            message, problems = str(e), [] if word in str(e) else [f"message lacks {word!r}"]
        if planted.status_path.read_bytes() != status:
            problems.append("the planted folder's status changed")
        failures.append(_row(rows, "notebook", what, message, problems, tmp_path))
    code, output, _ = cli(["resume", victim.id, "--root", str(root), "--cluster", "local"], capfd)
    message = " ".join(output.split())
    problems = [] if code == 2 and "names the storage folder" in message and "Traceback" not in output else ["bad"]
    failures.append(
        _row(rows, "CLI", "`ortlab resume RUN --cluster local` of the same folder", message, problems, tmp_path)
    )
    if _files(victim.path) != before:
        failures.append("notebook: the victim's remote place changed")
    return failures


def test_every_hostile_input_is_refused_in_ortlabs_words(
    api, runs_root, tiny_bert, tiny_chat_llama, tmp_path, monkeypatch, capfd
):
    """One test for the whole table, so that it is whole whatever order the suite runs in: the server's cases, the
    CLI's (in a folder of their own: nothing they write may land outside it), the notebook's. It writes
    test-artifacts/hostile-round3.md, and docs/reliability.md must carry every case of it."""
    rows: list[dict] = []
    failures = _server_part(rows, api, runs_root, tmp_path)
    failures += _cli_part(rows, tiny_bert, tiny_chat_llama, tmp_path / "cli", monkeypatch, capfd)
    failures += _notebook_part(rows, tmp_path / "notebook", capfd)
    out = ROOT / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "hostile-round3.json").write_text(json.dumps(rows, indent=2))
    (out / "hostile-round3.md").write_text(render(rows))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)
    assert len(rows) >= 50
    documented = DOC.read_text().split(TITLE, 1)[-1]
    missing = [r["case"] for r in rows if f"| {r['case']} |" not in documented]
    assert not missing, f"docs/reliability.md lacks these cases (copy test-artifacts/hostile-round3.md): {missing}"
    assert f"{TITLE}: {len(rows)} of {len(rows)} refused cleanly" in DOC.read_text()


# --- any reader, on a run folder from elsewhere ------------------------------------------------------------------


def _worst_folders(root: Path) -> list[RunDir]:
    """Run folders from elsewhere, every file in them at most a few KB, each of the worst kind a reader meets: a
    spec of aliases; JSON nested 2,000 deep; numbers of 4,290 digits and 1e308; lines of control characters and
    terminal escapes; checkpoints named with other digits; metrics and a log that are a link to /dev/zero and a
    FIFO; a status that is a link to a file of the user's."""
    made = []
    for name in ("worst", "linked"):
        run = RunDir.create(root, RunSpec(name=name))
        made.append(run)
        (run.path / "spec.yaml").write_text(LAUGHS.replace("a: &a", "x: &a", 1) + "hyper: {batch_size: *i}\n")
        for checkpoint in ("checkpoint-²", "checkpoint-٣", "checkpoint-" + "9" * 200):
            _checkpoint(run, checkpoint)
    worst, linked = made
    worst.status_path.write_text('{"state": "running", "step": ' + "9" * 4290 + ', "pid": ' + "[" * 2000 + "]" * 2000)
    worst.result_path.write_text("[" * 2000 + "]" * 2000)
    lines = [
        '{"event": "step", "step": 1e308, "loss": 1e308, "samples_per_s": -1e308, "tokens": ' + "9" * 4290 + "}",
        '{"event": "step", "step": 2, "loss": ' + "[" * 1000 + "]" * 1000 + "}",
        json.dumps({"event": "eval", "step": 3, "eval_loss": "\x1b]8;;http://x\x07click\x1b[2J\r\x00"}),
        "\x1b[31m" * 200,
    ]
    worst.metrics_path.write_text("\n".join(lines) + "\n" + "x" * 2000)  # (and a last line without its end)
    worst.log_path.write_text("\x1b[2J\x1b]0;owned\x07" * 100)
    linked.metrics_path.unlink(missing_ok=True)
    linked.metrics_path.symlink_to("/dev/zero")
    linked.log_path.unlink(missing_ok=True)
    os.mkfifo(linked.log_path)
    mine = root.parent / "users-own-file.json"
    mine.write_text('{"state": "completed"}')
    linked.status_path.unlink()
    linked.status_path.symlink_to(mine)
    linked.result_path.symlink_to("/dev/zero")
    return made


def _readers(root: Path, runs: list[RunDir]) -> dict[str, Any]:
    """Every reader of a run folder: the notebook's, the server's, the CLI's, the views'."""
    from ortlab.runfolder.compare import compare, render, summarize
    from ortlab.runfolder.history import read_history
    from ortlab.runfolder.stream import records, summary_of
    from ortlab.server.runindex import RunIndex, metrics_since

    def each(read: Any) -> Any:
        return lambda: [_tolerated(read, run) for run in runs]

    index = RunIndex(root)
    return {
        "RunDir.read_status": each(lambda r: r.read_status()),
        "Run.status": each(lambda r: Run(r.path).status()),
        "Run.spec": each(lambda r: Run(r.path).spec()),
        "Run.metrics": each(lambda r: Run(r.path).metrics()),
        "Run.result": each(lambda r: Run(r.path).result()),
        "RunDir.last_checkpoint": each(lambda r: r.last_checkpoint()),
        "stream.records": each(lambda r: list(records(r.path))),
        "stream.summary_of": each(lambda r: summary_of(r.path)),
        "compare.summarize": each(lambda r: summarize(list(records(r.path)))),
        "history.read_history": each(lambda r: read_history(r.path, ["loss", "samples_per_s"], ["eval_loss"])),
        "server: the runs listing": lambda: index.rows(),
        "server: a run's detail": each(index.detail),
        "server: a run's metrics": each(lambda r: metrics_since(r, 0)),
        "compare and its table": lambda: render(_tolerated(lambda _: compare(runs), None) or []),
    }


def _tolerated(read: Any, run: Any) -> Any:
    """A reader may refuse a damaged folder in ortlab's words (OrtlabError, ValueError, OSError); anything else
    (a RecursionError, a MemoryError, a TypeError from a number it did not expect) is the reader's bug."""
    from ortlab.errors import OrtlabError

    try:
        return read(run)
    except (OrtlabError, ValueError, OSError):
        return None


def test_a_run_folder_from_elsewhere_costs_any_reader_at_most_1_s_and_100_mb(tmp_path, capsys):
    """The held-out style check of #48: every reader of a planted folder whose files are a few KB each, within 1 s
    of this process's CPU time and 100 MB of Python allocations (tracemalloc), and none hangs (a FIFO, /dev/zero)."""
    root = tmp_path / "runs"
    runs = _worst_folders(root)
    sizes = {p: p.lstat().st_size for run in runs for p in run.path.rglob("*") if not p.is_symlink()}
    assert max(sizes.values()) < 16 << 10, "every file of the planted folders is a few KB"
    costs, failures = {}, []
    for name, read in _readers(root, runs).items():
        started = time.process_time()
        read()
        cpu_s = time.process_time() - started
        tracemalloc.start()
        try:
            read()
            peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        costs[name] = {"cpu_s": round(cpu_s, 3), "peak_mb": round(peak_mb, 1)}
        if cpu_s > 1 or peak_mb > 100:
            failures.append(f"{name}: {cpu_s:.2f} s of CPU, {peak_mb:.0f} MB")
    capsys.readouterr()
    out = ROOT / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "planted-reader-costs.json").write_text(json.dumps(costs, indent=2))
    assert not failures, failures
