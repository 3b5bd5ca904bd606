"""Checks before the expensive work, on every data path (issue #48, item 6, and two of its Low findings).

Each bad input is refused in ortlab's words before any model loads (weights patched to raise, as in
test_reliability's hostile inputs): chat data whose answers are all cut off by max_length on the eager, lazy and
streamed paths; an output folder that is a file, before the model and data checks; a CSV that does not parse,
naming its line (before the run when its first rows show it, as the run's error when training reads it later);
a link or a FIFO inside a data folder; a FIFO or a device as the data source. A SIGTERM before training begins
ends the run at once (it only set a flag that nothing read until the first step)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from ortlab.data import DataError


@pytest.fixture
def no_model(monkeypatch):
    """Model weights never load: a test that reaches them fails."""
    from transformers import PreTrainedModel

    import ortlab.lifecycle.assemble  # (imported first: it binds ortlab.tasks.load_model by name)
    import ortlab.tasks

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a bad input")

    monkeypatch.setattr(ortlab.tasks, "load_model", refuse)
    monkeypatch.setattr(ortlab.lifecycle.assemble, "load_model", refuse)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", refuse)


def _chat(path: Path, rows: int, cut_every: int = 1) -> Path:
    """Conversations; every `cut_every`-th prompt (all by default) is so long that max_length=48 cuts off its answer."""
    out = []
    for i in range(rows):
        prompt = ("very " * 80 if i % cut_every == 0 else "") + f"is review {i} fresh?"
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "fresh" if i % 2 else "rotten"}]
        out.append(json.dumps({"messages": turns}))
    path.write_text("\n".join(out) + "\n")
    return path


def _chat_spec(model: Path, source: Path, out: Path, **data) -> dict:
    return {
        "name": "cut",
        "task": "causal-lm",
        "output_dir": str(out),
        "model": {"name": str(model)},
        "data": {"source": str(source), **data},
        "hyper": {"max_length": 48, "max_steps": 4, "batch_size": 2},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},
    }


@pytest.mark.parametrize("path", ["eager", "lazy", "streamed"])
def test_chat_with_every_answer_cut_off_is_refused_before_the_model_loads(path, tiny_chat_llama, tmp_path, no_model):
    """The lazy and streamed paths loaded the model, evaluated on 0 rows and read on; the eager one refused only
    after the model loaded. All three now refuse from the rows read first, before any weight."""
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    data = {"eager": {"lazy": False}, "lazy": {"lazy": True}, "streamed": {"streaming": True}}[path]
    source = _chat(tmp_path / "cut.jsonl", rows=1200 if path == "streamed" else 60)
    spec = RunSpec.model_validate(_chat_spec(tiny_chat_llama, source, tmp_path / "runs", **data))
    with pytest.raises(DataError, match=r"every assistant token beyond hyper.max_length=48.*nothing to learn"):
        train_spec(spec, progress=False, log=lambda line: None)
    assert not (tmp_path / "runs").exists()  # refused before the run folder


def test_a_large_share_cut_off_in_the_first_rows_is_refused_as_training_would(tiny_chat_llama, tmp_path, no_model):
    """Two of three answers cut off: training would fail at its 100th example (`Dropped.fail_on_large_share`); the
    check says so from the first rows instead."""
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec

    source = _chat(tmp_path / "most.jsonl", rows=300, cut_every=1)
    lines = source.read_text().splitlines()
    short = [json.loads(line) for line in lines]
    for row in short[::3]:
        row["messages"][0]["content"] = "is it fresh?"
    source.write_text("\n".join(json.dumps(r) for r in short) + "\n")
    spec = RunSpec.model_validate(_chat_spec(tiny_chat_llama, source, tmp_path / "runs", lazy=True))
    with pytest.raises(DataError, match=r"so more than 50% would be dropped"):
        check_model_and_data(spec, log=lambda line: None)


def test_a_sigterm_before_training_ends_the_run_at_once(tiny_chat_llama, tmp_path, monkeypatch):
    """SIGTERM only set a flag that the training loop reads after a step: a run stuck before training (a model
    load, an evaluation) did not end. Now it ends with a clear error; the run folder says failed, and why."""
    from ortlab.lifecycle import execute as lifecycle
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec

    def stuck_load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this call returns to Python
        raise AssertionError("the SIGTERM did not end the run before training")

    monkeypatch.setattr(lifecycle, "load_model_and_data", stuck_load)
    spec = RunSpec.model_validate(_chat_spec(tiny_chat_llama, tmp_path / "none.jsonl", tmp_path / "runs"))
    run = RunDir.create(tmp_path / "runs", spec)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Exception, match=r"stopped \(SIGTERM\) before training began") as ended:
        lifecycle.execute(run, checked=(str(tiny_chat_llama), None), progress=False, log=lambda line: None)
    assert type(ended.value).__name__ == "StoppedBeforeTraining"  # an OrtlabError: the CLI says it, no traceback
    assert signal.getsignal(signal.SIGTERM) == previous  # the process's own handler is back
    status = run.status()
    assert status["state"] == "failed" and "before training began" in status["error"]


def _refuse_checks(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model and data checks ran before the output folder was checked")

    monkeypatch.setattr("ortlab.fit.load_and_check", refuse)
    monkeypatch.setattr("ortlab.fit.resolve_model", refuse)


def test_an_output_folder_that_is_a_file_is_refused_before_the_model_and_data(tmp_path, monkeypatch, capfd):
    from ortlab.cli import app
    from ortlab.runfolder.naming import OutputFolderError
    from ortlab.runner import launch, train_spec
    from ortlab.spec import RunSpec

    _refuse_checks(monkeypatch)
    taken = tmp_path / "runs"
    taken.write_text("a file\n")
    inside = taken / "deeper"
    for args in (["train", "--output-dir", str(taken), "--quiet"], ["train", "--output-dir", str(inside), "-d"]):
        with pytest.raises(SystemExit) as ended:
            app(args, prog_name="ortlab")
        assert ended.value.code == 2
        said = " ".join(capfd.readouterr().err.split())
        assert "error: the output folder" in said and "is a file" in said and "--output-dir" in said, said
    for start in (lambda: train_spec(RunSpec(output_dir=str(taken)), progress=False), lambda: launch(root=taken)):
        with pytest.raises(OutputFolderError, match="is a file"):
            start()
    assert taken.read_text() == "a file\n"


def _csv(path: Path, rows: int, bad: dict[int, str]) -> Path:
    lines = ["text,label"] + [f"row {i} was a fine film,{i % 2}" for i in range(rows)]
    for line, text in bad.items():
        lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("streaming", [False, True])
def test_a_csv_that_does_not_parse_is_said_with_its_line_before_any_model(streaming, tiny_bert, tmp_path, no_model):
    """pandas' words ("An error occurred while generating the dataset", or a ParserError traceback from a stream)
    became ortlab's, naming the line: an unclosed quote, a line with more fields than the header."""
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec

    cases = {
        "quote": ({3001: '"an unclosed quote,1'}, r"a quote opens on line 3001 and never closes"),
        "fields": ({7: "one,too,many"}, r"line 7 has 3 fields where the header has 2"),
    }
    for name, (bad, said) in cases.items():
        source = _csv(tmp_path / f"{name}.csv", 5000, bad)
        data = {"source": str(source), "streaming": streaming}
        spec = RunSpec.model_validate({"model": {"name": str(tiny_bert)}, "data": data, "hyper": {"max_steps": 2}})
        with pytest.raises(DataError, match=rf"data.source: .*{name}.csv' is not valid CSV: {said}"):
            check_model_and_data(spec, log=lambda line: None)


def test_a_streamed_csv_line_that_does_not_parse_fails_the_run_naming_it(tiny_bert, tmp_path, monkeypatch):
    """Beyond the rows the checks read (pandas parses a stream 10,000 rows at a time), the line is found when
    training reads it: the run fails in ortlab's words, with the line, not with pandas' traceback."""
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    monkeypatch.setattr("ortlab.data.checks.HEAD_ROWS", 50)
    source = _csv(tmp_path / "late.csv", 14000, {12001: '"an unclosed quote,1'})
    data = {"source": str(source), "streaming": True, "max_eval_samples": 20}  # shuffled: a 10,000-row buffer
    hyper = {"max_steps": 2, "batch_size": 2, "max_length": 16}
    accel = {"ort": False, "fused_adam": False, "precision": "fp32"}
    spec = RunSpec.model_validate(
        {"model": {"name": str(tiny_bert)}, "data": data, "hyper": hyper, "accel": accel, "output_dir": str(tmp_path)}
    )
    with pytest.raises(DataError, match=r"late.csv' is not valid CSV: a quote opens on line 12001 and never closes"):
        train_spec(spec, progress=False, log=lambda line: None)


def test_links_and_fifos_inside_a_data_folder_are_refused_a_named_link_is_followed(tmp_path):
    """A data folder took in a link's target (any file, anywhere) and trained the model on it. Inside a folder
    nothing is followed now; a path the user names (a link included) is theirs to name."""
    from ortlab.data import resolve_source
    from ortlab.spec import DataSpec

    elsewhere = _csv(tmp_path / "elsewhere.csv", 10, {})
    folder = tmp_path / "data"
    (folder / "part").mkdir(parents=True)
    _csv(folder / "own.csv", 10, {})
    (folder / "part" / "borrowed.csv").symlink_to(elsewhere)
    with pytest.raises(DataError, match=r"not its own: part/borrowed.csv \(a link\).*does not follow links"):
        resolve_source(DataSpec(source=str(folder)))
    (folder / "part" / "borrowed.csv").unlink()
    os.mkfifo(folder / "part" / "pipe.csv")
    with pytest.raises(DataError, match=r"part/pipe.csv \(not a regular file\)"):
        resolve_source(DataSpec(source=str(folder)))
    (folder / "part" / "pipe.csv").unlink()
    (folder / "notes.md").symlink_to(elsewhere)  # not a data file: not read, so not refused
    assert resolve_source(DataSpec(source=str(folder))) == ("csv", [str(folder / "own.csv")])
    named = tmp_path / "named.csv"
    named.symlink_to(elsewhere)
    assert resolve_source(DataSpec(source=str(named))) == ("csv", [str(named)])


@pytest.mark.parametrize("kind", ["fifo", "device", "link to a fifo"])
def test_a_fifo_or_a_device_as_the_data_is_refused(kind, tmp_path, no_model, capfd):
    """A FIFO as --data was called a folder with no data files (a device too); reading one would wait forever."""
    from ortlab.cli import app

    source = tmp_path / "pipe.csv"
    if kind == "device":
        source = Path(os.devnull)
    else:
        os.mkfifo(tmp_path / "pipe.csv")
        if kind == "link to a fifo":
            source = tmp_path / "link.csv"
            source.symlink_to(tmp_path / "pipe.csv")
    args = ["train", "--data", str(source), "--output-dir", str(tmp_path / "runs"), "--quiet"]
    with pytest.raises(SystemExit) as ended:
        app(args, prog_name="ortlab")
    said = " ".join(capfd.readouterr().err.split())
    assert ended.value.code == 2, said
    assert f"error: data.source: '{source}' is not a regular file or a folder (a FIFO, a socket or a device)" in said
