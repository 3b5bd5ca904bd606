"""Opening a long run fast, without trusting its file more: the fast line parse gives exactly the careful parse's
records (and skips) on odd lines, the C-level extremes equal the careful loop's, a history read in one pass draws
the same curves, summary and labels as the live path fed one record at a time, and the route's float columns
thin a page as the lists of raw values did."""

from __future__ import annotations

import json
import math
import random
from array import array

import pytest

from ortlab.runfolder import stream
from ortlab.runfolder.downsample import LiveSeries, keep_indices
from ortlab.runfolder.history import read_history
from ortlab.runfolder.lines import parse_line, parse_plain, plain_numbers

STEP = {"event": "step", "step": 1, "loss": 1.5, "samples_per_s": 40.0, "step_time_s": 0.2, "samples": 8, "tokens": 9}

# Lines a copied or hand-made metrics file may hold, each next to ordinary ones.
ODD_LINES = [
    b'{"event": "step", "step": 2, "loss": 1e999, "samples_per_s": -1E+400}',  # overflow: None, never inf
    b'{"event": "step", "step": 3, "loss": NaN, "samples_per_s": Infinity, "x": -Infinity}',
    b'{"event": "step", "step": 4, "loss": ' + b"9" * 250 + b".5e99}",  # 10^349 without a 3-digit exponent
    b'{"event": "step", "step": 5, "loss": ' + b"1" * 320 + b".0}",  # 10^319 from digits alone
    b'{"event": "step", "step": 6, "loss": 1.5e-300, "samples_per_s": 2.5e+307}',  # finite, near the edges
    b'{"event": "step", "step": 7, "loss": ' + b"7" * 5000 + b"}",  # an integer past Python's digit limit
    b'{"event": "step", "step": 8, "loss": ' + b"7" * 400 + b"}",  # an integer too big for a float
    b'{"event": "step", "step": 9, "workers": [{"step_time_s": 1e999}], "summary": {"a": [NaN, 1e400]}}',
    b'{"event": "eval", "step": 9, "eval_loss": 0.5}',
    b'{"event": "step", "step": 10, "loss": 1.0}{"event": "step"}',  # two objects on one line
    b'{"event": "step", "step": 11, "loss": 1.0',  # cut short
    b"[1, 2, 3]",
    b'"a string"',
    b"42",
    b"",
    b"   ",
    b'  {"event": "train_begin", "max_steps": 20}  ',  # whitespace around an object
    b'{"event": "step", "step": 12, "loss": 2.0}\r',  # CRLF
    b'{"event": "step", "step": 13, "a": "caf\xc3\xa9", "b": "\\u00e9\\n"}',
    b'{"event": "step", "step": 14, "loss": "\xff\xfe"}',  # not UTF-8
    b'{"event": "step", "step": 15, "loss": 1.0, "loss": 2.0}',  # a repeated key: the last wins in both
    b'{"event": "step", "step": true, "loss": false, "samples_per_s": "fast"}',
    b'{"event": "step", "step": 16, "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # deeper than the recursion limit
    b'{"e": "tab\there"}',  # a raw control character: strict JSON says no
    b"{}",
    b'{"event": "step", "step": 17, "loss": 1e+05, "lr": 1e-05, "e000": 1}',  # looks like an overflow: careful path
]


def _lines() -> list[bytes]:
    ordinary = [json.dumps({**STEP, "step": i}).encode() for i in range(20, 26)]
    return [line for odd in ODD_LINES for line in (odd, *ordinary[:2])] + ordinary


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def test_the_fast_parse_answers_exactly_as_the_careful_one_on_odd_lines():
    for line in _lines():
        # The stream's rule: the fast parse only where the bytes rule an overflowing number out.
        careful = parse_line(line)
        fast = parse_plain(line) if plain_numbers(line) else parse_line(line)
        assert fast == careful and type(fast) is type(careful), line[:80]
        assert _finite(fast), line[:80]
    # The overflow shapes are seen in the bytes (NaN and Infinity need not: parse_constant has them); ortlab's
    # own numbers are not taken for them.
    assert not any(plain_numbers(ODD_LINES[i]) for i in (0, 2, 3, 7)) and plain_numbers(ODD_LINES[1])
    assert not plain_numbers(b'{"loss": 1e999}') and not plain_numbers(b'{"loss": 1.0E+308}')
    assert not plain_numbers(b'{"loss": ' + b"1" * 200 + b".0}")
    assert plain_numbers(json.dumps({**STEP, "learning_rate": 1e-05, "big": 1.7e99, "n": 10**150}).encode())


@pytest.mark.parametrize("piece", [7, 64, 4096, stream.PIECE_BYTES])
def test_the_stream_gives_the_careful_records_and_skips_whatever_the_piece_size(tmp_path, monkeypatch, piece):
    """Pieces of 7 bytes cut every line and every odd number across reads: the per-piece check must still see it."""
    monkeypatch.setattr(stream, "PIECE_BYTES", piece)
    lines = _lines()
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    got = stream.MetricsStream(tmp_path)
    records = list(got.records(None))
    expected = [r for r in map(parse_line, lines) if isinstance(r, dict)]
    assert records == expected and all(_finite(r) for r in records)
    reasons = [r for r in map(parse_line, lines) if isinstance(r, str)]
    assert got.skipped == len(reasons) and [s.reason for s in got.skips] == reasons[-stream.MAX_SKIPS_KEPT :]
    assert got.offset == (tmp_path / "metrics.jsonl").stat().st_size


def test_the_c_level_extremes_equal_the_careful_loop():
    rng = random.Random(1)
    for n in (50, 1_001, 20_000):
        ys = [rng.choice([0.0, -0.0, 1.0, 2.0, 2.0]) if i % 3 else rng.gauss(0, 1) for i in range(n)]
        for i in rng.sample(range(n), 5):
            ys[i] = rng.choice([math.nan, math.inf, -math.inf, 1e308])  # such buckets take the careful loop
        for bound in (4, 37, 1000):
            assert keep_indices([array("d", ys)], bound) == keep_indices([list(ys)], bound)
            assert keep_indices([array("d", ys), array("d", ys[::-1])], bound) == keep_indices(
                [list(ys), ys[::-1]], bound
            )


def test_a_live_series_extended_at_once_is_bounded_and_keeps_every_point_and_extreme():
    rng = random.Random(2)
    n = 50_000
    xs, ys = list(range(n)), [rng.gauss(0, 1) for _ in range(n)]
    ys[1234], ys[40_000] = 99.0, -99.0
    series = LiveSeries(200)
    series.extend(xs, ys)
    drawn_x, drawn_y = series.points()
    assert len(drawn_x) <= 200 + 3 and max(drawn_y) == 99.0 and min(drawn_y) == -99.0
    assert drawn_x[0] == 0 and drawn_x[-1] == n - 1 and series.full() == (xs, ys) and series.redraws == 1
    for i in range(n, 3 * n):  # then live points, which keep it bounded as add() always did
        series.add(i, 0.0)
        assert len(series.points()[0]) <= 200 + 3
    short = LiveSeries(200)
    short.extend(xs[:150], ys[:150])  # while it fits: every point, as add() one at a time draws them
    assert short.points() == (xs[:150], ys[:150])
    with pytest.raises(ValueError, match="differ in length"):
        LiveSeries(200).extend([1, 2], [1.0])


def _history_file(folder, steps: int) -> None:
    from ortlab.train.metricswriter import JsonLinesSink

    sink = JsonLinesSink(folder / "metrics.jsonl")
    sink({"event": "train_begin", "max_steps": steps, "accelerations": {"ort": {"requested": True}}})
    for step in range(1, steps + 1):
        record = {**STEP, "step": step, "loss": 2.0 / step, "peak_mem_mb": 900 + step % 7}
        if step % 97 == 0:
            record["loss"] = None  # a diverged step: no point
        if step % 101 == 0:
            record["samples_per_s"] = 10**400  # too big for a float: no point, no crash
        if step >= 13:
            record["mfu"] = 0.3  # a curve whose first point comes late
        sink(record)
        if step % 50 == 0:
            sink({"event": "eval", "step": step, "eval_loss": 1.0 / step})
    sink({"event": "verified", "accelerations": {"ort": {"requested": True, "applied": True}}})
    sink({"event": "acceleration", "name": "ort", "message": "applied"})
    sink.close()
    with open(folder / "metrics.jsonl", "ab") as f:
        f.write(b'{"event": "step", "step": "x", "loss": 1}\nnot json\n{"event": "eval", "step": 7}\n')


def test_a_history_read_in_one_pass_draws_what_the_live_path_drew(tmp_path):
    """The charts' open path (read_history + LiveSeries.extend) against the live path (consume per record)."""
    from ortlab.runner import Run
    from ortlab.ui.charts import PANELS, RunMonitor

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "completed"}')
    _history_file(run_dir, 3_000)
    run = Run(run_dir)
    opened = RunMonitor(throttle_s=3600, max_points=100)
    opened.add_run(run, follow=False)
    live = RunMonitor(throttle_s=3600, max_points=100)
    live.summaries[run.id] = stream.RunSummary()
    live._runs[run.id] = run
    for record in stream.records(run_dir):
        live.consume(run.id, record)
    live.flush()
    curves = [(name, "train") for name, _ in PANELS] + [("loss", "eval")]
    for panel, kind in curves:
        assert opened.series(run.id, panel, kind) == live.series(run.id, panel, kind), (panel, kind)
    assert len(opened.series(run.id, "mfu")[0]) == 3_000 - 12
    assert opened._traces == live._traces  # the same traces, in the same order
    for a, b in zip(opened.figure.data, live.figure.data, strict=True):
        assert a.name == b.name
    for panel, kind in curves:  # drawn bounded, the extremes kept by both ways
        (_, a), (_, b) = opened.drawn(run.id, panel, kind), live.drawn(run.id, panel, kind)
        if not b:  # (a panel this CPU run has no values for: no curve either way)
            assert not a, (panel, kind)
            continue
        assert len(a) <= 100 + 3 and min(a) == min(b) and max(a) == max(b), (panel, kind)
    assert "[ort]" in opened.figure.data[0].name
    view_opened, view_live = opened.summaries[run.id].view(), live.summaries[run.id].view()
    assert view_opened.pop("skipped") == 1 and len(view_opened.pop("skips")) == 1  # (the history says so too)
    assert view_opened == {k: v for k, v in view_live.items() if k not in ("skipped", "skips")}
    history = read_history(run_dir, ["loss"])
    assert history.stream.offset == (run_dir / "metrics.jsonl").stat().st_size
    assert list(history.last) == ["train_begin", "verified", "acceleration"]
    for monitor in (opened, live):
        monitor.close()


def test_a_followed_run_goes_on_from_where_its_history_ended(tmp_path):
    from ortlab.runner import Run
    from ortlab.ui.charts import RunMonitor

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "completed"}')
    _history_file(run_dir, 500)
    monitor = RunMonitor(Run(run_dir), throttle_s=0.05)
    monitor.wait_idle(60)
    xs, _ = monitor.series("run")
    assert xs == sorted(set(xs)) and len(xs) == 500 - 5  # each step once: not read twice, none lost
    monitor.close()


def test_a_view_of_finished_runs_holds_them_whole_as_it_is_displayed(tmp_path):
    """A notebook cell `RunMonitor(*runs)` after the runs ended: the static view its output keeps is computed as the
    cell displays it, and a finished run never changes state to have it re-published. It once showed "step 0,
    applied none" there (the follower thread had not read the history yet; seen in notebook 02's saved output)."""
    from ortlab.runner import Run
    from ortlab.ui.charts import RunMonitor
    from ortlab.ui.summary import static_summary

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "completed"}')
    _history_file(run_dir, 3_000)
    run = Run(run_dir)
    monitor = RunMonitor(run, throttle_s=3600)
    shown = repr(monitor)  # what the cell's saved output keeps, computed at once
    assert shown == static_summary([run])[1]  # the same view read from the folder now
    assert "step 3000" in shown and "applied ort" in shown, shown
    monitor.close()


def test_the_route_thins_float_columns_as_it_thinned_raw_values():
    from ortlab.server.runindex import DRAWN, _column, thin_steps

    rng = random.Random(3)
    records = []
    for i in range(5_000):
        loss = rng.choice([rng.gauss(1, 1), None, "x", True, 10**400, rng.randrange(5)])
        records.append({"event": "step", "step": i, "loss": loss, "samples_per_s": rng.gauss(40, 3)})
        if i % 300 == 0:
            records.append({"event": "eval", "step": i})
    steps = [i for i, r in enumerate(records) if r["event"] == "step"]
    for bound in (4, 100, 2000):
        raw = [
            [
                records[i].get(name)
                if not isinstance(records[i].get(name), int) or records[i].get(name) < 10**300
                else None
                for i in steps
            ]
            for name in DRAWN
        ]  # (the old columns, less the int that crashed them)
        assert keep_indices([_column(records, steps, name) for name in DRAWN], bound) == keep_indices(raw, bound)
        sent, dropped = thin_steps(records, bound)
        assert sum(r["event"] == "step" for r in sent) <= bound and dropped > 0
        assert sum(r["event"] == "eval" for r in sent) == 17
