"""The one metrics reader (`ortlab.runfolder.stream`): bounded, incremental, and not stopped by a hostile file.

Each test here is an attack that once worked: a line of 20 MiB stalled the sidebar for ever, a bare `\\r` stopped
every reader, a 48 MiB file listed by the Jupyter server cost it hundreds of MB while other requests waited, the
workbench re-read every file every 2 s. The summary every view now shares is checked against the folds it replaced,
on a real training run's metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import PYTHON, ROOT
from fake_runs import append, make_fake_run, step_record

from ortlab.runfolder import events
from ortlab.runfolder.rundir import RunDir, read_metrics
from ortlab.toggles import NAMES

MiB = 2**20


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r.get("event") == "step"]


def _write_hostile(path: Path) -> None:
    """Steps 1..3, then every kind of line a reader must pass over, then steps 4..5 and a line still being written."""
    with path.open("wb") as f:
        f.write(b"".join(_line(step_record(s)) for s in (1, 2, 3)))
        f.write(b'{"event": "step", "step": 90, "pad": "' + b"x" * (20 * MiB) + b'"}\n')  # 20 MiB
        f.write(b'{"event": "step", "step": 91}\r{"event": "step", "step": 92}\n')  # a bare CR inside a line
        f.write(b'{"event": "step", "step": 93, "note": "\xff\xfe"}\n')  # not UTF-8
        f.write(b"[" * 100_000 + b"\n")  # nested deeper than the parser's recursion
        f.write(b"[1, 2]\n")  # JSON, not an object
        f.write(_line(step_record(4))[:-1] + b"\r\n")  # a Windows line end: a record like any other
        f.write(b'{"event": "step", "step": 5, "loss": NaN, "samples_per_s": 1e999}\n')
        f.write(b'{"event": "step", "st')  # being written


# --- the reader ---------------------------------------------------------------------------------------------------


def test_a_20_mib_line_is_passed_over_in_bounded_reads_and_the_later_records_come(tmp_path):
    """rundir.read_metrics with a bound never moved past a line longer than the bound: the sidebar's metrics route
    returned the same offset for ever. Now the line is scanned to its newline (never held) and recorded as skipped."""
    path = tmp_path / "metrics.jsonl"
    _write_hostile(path)
    offset, records = 0, []
    for _ in range(40):  # 8 MiB a call: the 20 MiB line takes three
        got, new = read_metrics(path, offset, max_bytes=8 * MiB)
        records += got
        if new == offset:
            break
        offset = new
    assert _steps(records) == [1, 2, 3, 4, 5], "the records after the long line (and the odd ones) are read"
    assert offset == path.stat().st_size - len(b'{"event": "step", "st'), "stops before the unfinished line"
    five = records[-1]
    assert five["loss"] is None and five["samples_per_s"] is None, "NaN and 1e999 are read as null (JSON can hold it)"

    from ortlab.runfolder.stream import LINE_LIMIT, MetricsStream

    stream = MetricsStream(tmp_path)
    assert _steps(stream.read(None)) == [1, 2, 3, 4, 5]
    reasons = [(s.reason, s.length) for s in stream.skips]
    assert reasons[0] == (
        f"longer than {LINE_LIMIT} bytes",
        20 * MiB + len(b'{"event": "step", "step": 90, "pad": ""}'),
    )
    assert [r for r, _ in reasons[1:]] == ["not JSON", "not UTF-8", "not JSON", "not a JSON object"]
    assert stream.skipped == 5
    # (the offset from the file itself: a record's timestamp is written with as many digits as its float needs)
    assert stream.skips[0].offset == path.read_bytes().index(b'{"event": "step", "step": 90'), "where the line starts"


def test_a_bare_cr_and_invalid_utf8_do_not_stop_a_reader(tmp_path):
    """bytes.splitlines() splits on a bare \\r too: the piece before it has no \\n, so every reader stopped there."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        _line(step_record(1))
        + b'{"event": "log", "step": 1}\r{"event": "log", "step": 1}\n'
        + b'{"event": "step", "step": 2, "note": "\xc3\x28"}\n'
        + _line(step_record(3))
    )
    records, offset = read_metrics(path)
    assert _steps(records) == [1, 3]
    assert offset == path.stat().st_size, "every line consumed: a follower does not stall on the \\r line"
    assert RunDir(tmp_path).last_step() == 3


def test_reading_a_long_line_holds_a_piece_not_the_file(tmp_path):
    """Memory while reading is about one read piece plus one capped line, whatever the file or its lines hold."""
    path = tmp_path / "metrics.jsonl"
    _write_hostile(path)
    tracemalloc.start()
    try:
        read_metrics(path, 0, max_bytes=8 * MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * MiB, f"reading held {peak / MiB:.1f} MiB"


def test_a_linked_or_special_metrics_file_is_not_read(tmp_path):
    """A copied run folder may hold metrics.jsonl -> /etc/passwd (served to the browser), or a FIFO (blocks)."""
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"event": "step", "step": 7, "secret": "hunter2"}) + "\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "metrics.jsonl").symlink_to(secret)
    assert read_metrics(linked / "metrics.jsonl") == ([], 0)
    from ortlab.runfolder.stream import MetricsStream

    stream = MetricsStream(linked)
    assert stream.read() == [] and "link" in stream.problem

    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "metrics.jsonl")
    answer: list = []
    reader = threading.Thread(target=lambda: answer.append(read_metrics(fifo / "metrics.jsonl")), daemon=True)
    reader.start()
    reader.join(20)
    assert answer == [([], 0)], "a FIFO is refused at once, not waited on"


def test_a_replaced_or_cut_file_is_read_afresh_by_a_follower(tmp_path):
    from ortlab.runfolder.stream import SummaryFollower

    path = tmp_path / "metrics.jsonl"
    append(path, *[step_record(s, loss=1.0) for s in range(1, 6)])
    follower = SummaryFollower(tmp_path)
    assert follower.refresh().step == 5
    path.write_text(json.dumps(step_record(2, loss=9.0)) + "\n")  # cut (and rewritten shorter)
    summary = follower.refresh()
    assert (summary.step, summary.loss, summary.records) == (2, 9.0, 1)


# --- the one summary, against the folds it replaced ----------------------------------------------------------------


def _old_summarize(records: list[dict], warmup_steps: int = 2) -> dict:
    """`ortlab.runfolder.compare.summarize` as it was (a list of every record, folded at once)."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def is_step(r: dict) -> bool:
        return isinstance(r.get("step"), int) and all(number(r.get(k)) for k in ("step_time_s", "samples", "tokens"))

    segments: list[list[dict]] = []
    for r in records:
        if r.get("event") == "train_begin" or not segments:
            segments.append([])
        if r.get("event") == "step" and is_step(r):
            segments[-1].append(r)
    warm = [s for seg in segments for s in seg[:warmup_steps]]
    steady = [s for seg in segments for s in seg[warmup_steps:]]
    steps = [s for seg in segments for s in seg]
    out: dict = {
        "steps": max((s["step"] for s in steps), default=0),
        "warmup_steps": len(warm),
        "warmup_time_s": sum(s["step_time_s"] for s in warm),
        "final_loss": steps[-1]["loss"] if steps else None,
        "peak_mem_mb": max((s["peak_mem_mb"] for s in steps if number(s.get("peak_mem_mb"))), default=None),
        "mem_kind": steps[-1].get("mem_kind") if steps else None,
    }
    t = sum(s["step_time_s"] for s in steady)
    if steady and t > 0:
        out["steady_samples_per_s"] = sum(s["samples"] for s in steady) / t
        out["steady_tokens_per_s"] = sum(s["tokens"] for s in steady) / t
        out["steady_step_time_s"] = t / len(steady)
        timed = [s for s in steady if number(s.get("mfu"))]
        if timed and (tm := sum(s["step_time_s"] for s in timed)) > 0:
            out["steady_mfu"] = sum(s["mfu"] * s["step_time_s"] for s in timed) / tm
        timed = [s for s in steady if number(s.get("model_tflops_per_s"))]
        if timed and (tm := sum(s["step_time_s"] for s in timed)) > 0:
            out["steady_model_tflops_per_s"] = sum(s["model_tflops_per_s"] * s["step_time_s"] for s in timed) / tm
    for key in ("gpu_mem_step_peak_mb", "gpu_mem_reserved_mb"):
        values = [s[key] for s in steps if number(s.get(key))]
        if values:
            out[f"max_{key}"] = max(values)
    return out


def _old_index_fold(records: list[dict]) -> dict:
    """The server's `_Follow.fold` as it was."""
    out: dict = {"step": 0, "max_steps": None, "loss": None, "samples_per_s": None, "accelerations": {}}
    out.update(verified=False, steady=None)
    num = lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None  # noqa: E731
    for r in records:
        event = r.get("event")
        if event == "step":
            if isinstance(r.get("step"), int):
                out["step"] = max(out["step"], r["step"])
            out["loss"], out["samples_per_s"] = num(r.get("loss")), num(r.get("samples_per_s"))
        elif event == "train_begin" and isinstance(r.get("max_steps"), int) and r["max_steps"] > 0:
            out["max_steps"] = r["max_steps"]
        if event in ("train_begin", "verified", "train_end") and isinstance(r.get("accelerations"), dict):
            out["accelerations"] = r["accelerations"]
            out["verified"] = out["verified"] or event != "train_begin"
        if event == "train_end" and isinstance(r.get("summary"), dict):
            out["steady"] = num(r["summary"].get("steady_samples_per_s"))
    return out


@pytest.fixture(scope="module")
def trained_run(tiny_bert, tmp_path_factory) -> Path:
    """A real tiny training run (CLI, CPU, 6 steps, evaluations before and after)."""
    root = tmp_path_factory.mktemp("stream-runs")
    ortlab_cli = str(Path(PYTHON).parent / "ortlab")
    args = ["train", "--model", str(tiny_bert), "--max-train-samples", "64", "--max-eval-samples", "16"]
    args += ["--max-steps", "6", "--batch-size", "8", "--max-length", "32", "--no-ort", "--quiet"]
    args += ["--output-dir", str(root), "--name", "real"]
    proc = subprocess.run(
        [ortlab_cli, *args], capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "real"


@pytest.mark.slow
def test_the_summary_equals_the_old_folds_on_a_real_run(trained_run):
    from ortlab.runfolder.compare import row_for
    from ortlab.runfolder.stream import EVAL_KEYS, summary_of
    from ortlab.server.runindex import RunIndex

    run = RunDir(trained_run)
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert {"train_begin", "step", "eval", "verified", "train_end"} <= {r["event"] for r in records}
    # the one vocabulary: every event a real run writes is named in `events`, every acceleration in `toggles`
    assert {r["event"] for r in records} <= set(events.EVENTS)
    assert [list(r["accelerations"]) for r in records if r["event"] in events.WITH_ACCELERATIONS] == [list(NAMES)] * 3
    summary = summary_of(trained_run)
    assert summary.records == len(records) and summary.skipped == 0

    # compare.summarize and the trainer's own summary (result.json, from its in-memory steps)
    assert summary.throughput() == _old_summarize(records)
    written = {k: v for k, v in run.result()["summary"].items() if k != "train_time_s"}
    assert summary.throughput() == pytest.approx(written)
    # a resumed run: two segments, each with its own warm-up
    assert summary_of_records(records + records) == _old_summarize(records + records)

    # the server's row fold
    old = _old_index_fold(records)
    row = next(r for r in RunIndex(trained_run.parent).rows() if r["id"] == "real")
    assert (row["step"], row["max_steps"], row["loss"]) == (old["step"], old["max_steps"], old["loss"])
    assert row["samples_per_s"] == old["steady"], "an ended run shows its steady-state throughput"
    acc = old["accelerations"]
    assert row["requested"] == [k for k, v in acc.items() if v.get("requested")]
    assert row["applied"] == [k for k, v in acc.items() if v.get("applied")]
    assert row["verified"] is old["verified"] is True
    assert (row["catching_up"], row["skipped_lines"]) == (False, 0)

    # compare / `ortlab runs` rows, and rundir's last step
    compared = row_for(run)
    evals = [r for r in records if r["event"] == "eval"]
    last_eval = run.result().get("eval_after") or evals[-1]
    assert compared.eval == {k: last_eval[k] for k in EVAL_KEYS if isinstance(last_eval.get(k), (int, float))}
    assert compared.summary == _old_summarize(records)
    assert (compared.requested, compared.applied) == (row["requested"], row["applied"])
    assert summary.scores == {k: evals[-1][k] for k in EVAL_KEYS if k in evals[-1]}
    before = next(r for r in evals if r.get("phase") == "before")
    assert summary.eval_before == {k: v for k, v in before.items() if k.startswith("eval_")}
    assert run.last_step() == max(r["step"] for r in records if r["event"] == "step") == 6


@pytest.mark.slow
def test_a_real_run_writes_only_fields_its_record_schema_names(trained_run):
    """Every record a real run wrote (train_begin, steps, evaluations, log lines, verified, parameters, train_end)
    holds only fields `ortlab.runfolder.records` names for its event: a field the writer adds without the schema
    fails here. (The CUDA-only step fields are held to it by tests/test_records.py, from the writer's code.)"""
    from ortlab.runfolder.records import RECORDS, unknown_fields

    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert {events.TRAIN_BEGIN, events.STEP, events.EVAL, events.PARAMETERS} <= {r["event"] for r in records}
    assert {f"{r['event']}:{k}" for r in records for k in unknown_fields(r)} == set()
    # and every field the schema says a step always has, every step has
    always = [f.name for f in RECORDS[events.STEP].all_fields() if not f.when]
    assert all(set(always) <= set(r) for r in records if r["event"] == events.STEP), always


def summary_of_records(records: list[dict]) -> dict:
    from ortlab.runfolder.stream import RunSummary

    return RunSummary().fold_all(records).throughput()


def test_compare_reads_a_big_file_in_bounded_memory(tmp_path):
    """`ortlab runs` / `ortlab compare` fold the stream as it is read: no list of every record."""
    from ortlab.runfolder.compare import row_for

    folder = make_fake_run(tmp_path, "big", "completed", steps=5)
    with (folder / "metrics.jsonl").open("ab") as f:
        f.write(b"".join(_line(step_record(s)) for s in range(6, 30_000)))  # ~9 MiB
    tracemalloc.start()
    try:
        row = row_for(RunDir(folder))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert row.summary["steps"] == 29_999
    assert peak < 8 * MiB, f"comparing held {peak / MiB:.1f} MiB"


# --- views: the workbench's table and the server's list --------------------------------------------------------


def test_the_workbench_table_comes_from_the_live_summaries_not_from_rereading_files(tmp_path):
    """The workbench refreshed its table every 2 s by re-reading every run's whole metrics file."""
    pytest.importorskip("ipywidgets")
    from ortlab.ui import Workbench

    folder = make_fake_run(tmp_path, "shown", "completed", steps=12)
    wb = Workbench(root=str(tmp_path))
    try:
        assert ">12<" in wb.comparison.value
        (folder / "metrics.jsonl").rename(tmp_path / "elsewhere.jsonl")  # a refresh that read the file would see 0
        wb.refresh_comparison()
        assert ">12<" in wb.comparison.value, wb.comparison.value
    finally:
        wb.monitor.close()


def test_the_run_index_reads_a_long_history_a_budget_at_a_time(tmp_path, monkeypatch):
    from ortlab.server import runindex as server_runs

    folder = make_fake_run(tmp_path, "long", "running", steps=3)
    append(folder / "metrics.jsonl", *[step_record(s) for s in range(4, 6001)])  # ~1.9 MiB
    append(folder / "metrics.jsonl", {"event": "step", "step": 6001, "pad": "x" * (3 * MiB)})
    append(folder / "metrics.jsonl", step_record(6002))
    monkeypatch.setattr(server_runs, "ROWS_BUDGET_BYTES", MiB // 2)
    index = server_runs.RunIndex(tmp_path)
    seen = []
    for _ in range(30):
        (row,) = index.rows()
        seen.append(row["step"])
        if not row["catching_up"]:
            break
    assert seen[0] < 6000 and seen == sorted(seen), seen
    assert (row["step"], row["skipped_lines"], row["catching_up"]) == (6002, 1, False)


def _server_pid(port: int) -> int:
    children = psutil.Process().children(recursive=True)
    return next(p.pid for p in children if f"--port={port}" in " ".join(p.cmdline()))


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=300) as r:
        return json.load(r)


@pytest.mark.slow
def test_the_jupyter_server_lists_a_huge_run_in_bounded_memory_and_keeps_answering(tmp_path):
    """Against a real Jupyter server process: a 48 MiB metrics file (~190,000 steps) is listed without the server's
    memory growing by hundreds of MB, and another request is answered while the first list is being read."""
    from lab_server import start_lab

    root = tmp_path / "runs"
    make_fake_run(root, "small", "completed", steps=3)
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"ortlab": True}}})
    )
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    token = "ortlab-stream-test"
    with start_lab(tmp_path, token, (f"--Ortlab.runs_root={root}",), env) as url:
        api = f"{url}/ortlab/api"
        assert [r["id"] for r in _get(f"{api}/runs?token={token}")["runs"]] == ["small"]  # imports done, warm
        server = psutil.Process(_server_pid(int(url.rsplit(":", 1)[1])))
        rss_before = server.memory_info().rss

        huge = make_fake_run(root, "huge", "completed", steps=0)
        template = json.dumps(step_record(0)).replace('"step": 0', '"step": %d')
        last = 190_000
        with (huge / "metrics.jsonl").open("a") as f:
            f.write("".join(template % s + "\n" for s in range(1, last + 1)))
        assert (huge / "metrics.jsonl").stat().st_size > 45 * MiB

        # The peak is what hurts (the old reader's records were freed after each request): sample it throughout.
        peak, sampling = [rss_before], threading.Event()

        def sample() -> None:
            while not sampling.wait(0.01):
                peak.append(max(peak[-1], server.memory_info().rss))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        first: dict = {}
        listing = threading.Thread(target=lambda: first.update(_get(f"{api}/runs?token={token}")))
        listing.start()
        while listing.is_alive():  # other requests go on meanwhile (how many fit in depends on the machine's speed)
            assert _get(f"{api}/runs/small?token={token}")["step"] == 3
        listing.join()
        # What keeps every other request from waiting for the whole file: one list reads its budget of the history
        # and answers, the huge run still catching up (the old index read all 48 MiB under its lock first).
        assert next(r for r in first["runs"] if r["id"] == "huge")["catching_up"] is True, first

        for _ in range(20):  # each list reads its budget of the huge history; the sidebar's next polls read on
            row = next(r for r in _get(f"{api}/runs?token={token}")["runs"] if r["id"] == "huge")
            if not row["catching_up"]:
                break
        assert (row["step"], row["skipped_lines"]) == (last, 0)
        sampling.set()
        sampler.join()
        growth = peak[-1] - rss_before
        assert growth < 200 * MiB, f"the server grew by {growth / MiB:.0f} MiB listing a 48 MiB metrics file"


def test_workers_and_restarts_are_folded_once_for_every_view(tmp_path):
    """A two-worker stream with one restart: the summary counts the restart, keeps each rank's steady step time
    (the slower rank shows), and `ortlab runs`/`compare` say so. A malformed `workers` field is passed over."""
    from ortlab.runfolder.compare import row_for, worker_throughput
    from ortlab.runfolder.stream import summary_of

    run = RunDir(make_fake_run(tmp_path, "two", state="completed", steps=0))
    status = run.read_status()
    run.update_status(launcher={**(status.get("launcher") or {}), "cluster": "local", "kind": "ray-train"})
    steps = []
    for n in range(1, 7):
        record = step_record(n)  # 16 samples in 0.4 s on the two ranks together
        record["workers"] = [{"step_time_s": 0.4, "peak_mem_mb": 900.0}, {"step_time_s": 0.8, "peak_mem_mb": 910.0}]
        steps.append(record)
    bad = {**step_record(7), "workers": ["not a worker"]}
    restart = {
        "event": "restart",
        "attempt": 1,
        "failed_workers": [1],
        "reason": "rank 1: died",
        "resumes_from_step": 4,
    }
    append(
        run.metrics_path,
        {"event": "train_begin", "max_steps": 7, "world_size": 2},
        *steps[:4],
        restart,
        *steps[4:],
        bad,
    )

    summary = summary_of(run.path)
    assert (summary.world_size, summary.restarts) == (2, 1)
    times = summary.throughput()["worker_step_time_s"]
    assert times == pytest.approx([0.4, 0.8]), "the steady steps' mean per rank (the bad line's list left out)"
    row = row_for(run)
    assert row.where == "cluster local, 2 workers, 1 restart"
    # Each rank trains half of a step's 16 samples: 8 / 0.4 s and 8 / 0.8 s.
    assert worker_throughput(row.summary) == pytest.approx([20.0, 10.0])
    assert worker_throughput({"steady_samples_per_s": 40.0}) is None, "one process: no per-worker numbers"
