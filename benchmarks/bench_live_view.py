"""What the live view costs per refresh as a run gets long: the workbench's charts and the server's metrics route.

    .venv/bin/python benchmarks/bench_live_view.py            # 100, 10,000 and 100,000-step runs
    .venv/bin/python benchmarks/bench_live_view.py --smoke    # 100 and 1,000 steps, a few refreshes (the test's)

Goal (issue #35): each refresh's work and the data it sends independent of the run's length.

What is measured, in this process (no browser, no kernel: the kernel side only):
- charts: a run folder with a synthetic metrics.jsonl of N steps (written by ortlab's own sink, the run-folder
  format) is opened in a `RunMonitor` (`open_s`: its history read and drawn), then `--refreshes` refreshes of 2 new
  steps each, as a live run brings them between two flushes: `refresh_ms` is the kernel's time for those records
  and the flush (consume + flush, p50 and max), `bytes_per_refresh` the JSON of the message of points the flush
  hands to the live chart's comm (`LiveChart.send_points`: only the new points of each changed curve, and the
  newest bucket's), `points_per_refresh` the points in it (both over the refreshes that only append);
  `whole_curve_refreshes` those that sent a curve whole (a redraw when its length doubled past the bound: the 1,000-
  step run's first refresh), `snapshot_points` what a view that opens is sent. (Before the live chart,
  plotly's FigureWidget sent each changed curve whole: 9 kB / 47 kB / 63 kB a refresh at 100 / 10,000 / 100,000
  steps, in live-view-2026-11-27.json.)
- server: `metrics_since` (the metrics route's work, without HTTP) from offset 0 of the N-step run, page after page
  until caught up, with max_points: total time, pages, answer bytes and step records sent; and without a bound
  (max_points at its limit, 20,000 a page) for comparison.
- opening: on the longest run, interleaved twice, in CPU seconds of this process (a shared machine's load inflates
  wall time several-fold, CPU time far less): the careful parse of every line against the stream's fast one, and
  the charts opened from the history in one pass against one record at a time through the live path.
- many runs (`--many-runs` finished runs of `--many-steps` steps, plus one live run growing 2 steps a refresh, in
  one runs folder): the list route until no row is catching up, every run's sparkline read from offset 0 at 200
  points, then per refresh the list and the live run's new metrics; the workbench's comparison opened (`reattach`:
  every run's charts and the table) and refreshed (the live run's records drawn, the table rebuilt).
- `load_average_before_after`: the 1/5/15-minute load averages at the start and the end.

Results go to benchmarks/results/live-view-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import cpu_name  # noqa: E402


def write_run(root: Path, name: str, steps: int, inside: Path | None = None):
    """A completed run folder with `steps` step records (and an eval every 500), as ortlab's sink writes them
    (in `inside`, a runs folder shared with other runs, else in a folder of its own under `root`)."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run
    from ortlab.spec import RunSpec
    from ortlab.train.metricswriter import JsonLinesSink

    run = RunDir.create(inside if inside is not None else root / name, RunSpec(name=name))
    sink = JsonLinesSink(run.metrics_path)
    sink({"event": "train_begin", "accelerations": {}})
    for step in range(1, steps + 1):
        sink(step_record(step))
        if step % 500 == 0:
            sink({"event": "eval", "step": step, "eval_loss": 2 / step})
    sink.close()
    run.set_status("completed")
    return Run(run.path)


def step_record(step: int) -> dict:
    import math

    return {
        "event": "step",
        "step": step,
        "loss": 2.0 / (1 + step / 100) + 0.05 * math.sin(step),
        "samples_per_s": 40.0 + 5 * math.sin(step / 7),
        "step_time_s": 0.2,
        "peak_mem_mb": 900.0 + step % 17,
        "samples": 8,
        "tokens": 256,
        "learning_rate": 1e-4,
        "epoch": step / 1000,
    }


def _wire(chart) -> list[tuple[int, int, bool]]:
    """Per message of points the chart hands to its comm: (bytes as JSON, points, whether a curve went whole)."""
    sizes: list[tuple[int, int, bool]] = []
    send = chart.send_points

    def recording(ops, snapshot=False):
        size = send(ops, snapshot)
        sizes.append((size, sum(len(xs) for _, _, xs, _ in ops), any(keep == 0 for _, keep, _, _ in ops)))
        return size

    chart.send_points = recording
    return sizes


def bench_charts(run, steps: int, max_points: int, refreshes: int) -> dict:
    from ortlab.ui.charts import RunMonitor

    started, cpu = time.perf_counter(), time.process_time()
    monitor = RunMonitor(throttle_s=3600, max_points=max_points)
    monitor.add_run(run, follow=False)
    open_s, open_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    sent = _wire(monitor.chart)
    times = []
    step = steps
    for _ in range(refreshes):
        t = time.perf_counter()
        for _ in range(2):
            step += 1
            monitor.consume(run.id, step_record(step))
        monitor.flush()
        times.append(time.perf_counter() - t)
    snapshot = monitor._snapshot()  # what a view that opens now is sent
    monitor.close()
    ms = [x * 1000 for x in times]
    appends = [(size, points) for size, points, whole in sent if not whole] or [(0, 0)]
    sizes = [size for size, _ in appends]
    return {
        "open_s": round(open_s, 3),
        "open_cpu_s": round(open_cpu_s, 3),
        "refresh_ms_p50": round(statistics.median(ms), 3),
        "refresh_ms_max": round(max(ms), 3),
        "bytes_per_refresh_p50": int(statistics.median(sizes)),
        "bytes_per_refresh_max": max(sizes),
        "points_per_refresh_max": max(points for _, points in appends),
        # Refreshes that sent a curve whole (its length doubled past the bound): counted apart, with their size.
        "whole_curve_refreshes": sum(1 for _, _, whole in sent if whole),
        "whole_curve_bytes_max": max((size for size, _, whole in sent if whole), default=0),
        "snapshot_points": sum(len(xs) for _, _, xs, _ in snapshot),
        "refreshes": refreshes,
    }


def bench_route(run, max_points: int) -> dict:
    from ortlab import safeio
    from ortlab.server.runindex import metrics_since

    started, cpu = time.perf_counter(), time.process_time()
    offset, pages, size, sent = 0, 0, 0, 0
    while True:
        answer = metrics_since(run.dir, offset, max_points)
        if not answer["records"]:
            break
        pages += 1
        size += len(safeio.dumps(answer))
        sent += sum(1 for r in answer["records"] if r.get("event") == "step")
        offset = answer["offset"]
    return {
        "max_points": max_points,
        "total_s": round(time.perf_counter() - started, 3),
        "total_cpu_s": round(time.process_time() - cpu, 3),  # (with the JSON encoding of the answers)
        "pages": pages,
        "payload_bytes": size,
        "steps_sent": sent,
    }


def _cpu_wall(fn) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.process_time() - cpu, time.perf_counter() - started


def bench_open(run, rounds: int = 2) -> dict:
    """Where opening a long run goes, interleaved A/B/A/B (CPU seconds of this process, which a busy machine
    inflates far less than wall time): the careful parse of every line against the stream's (fast) one, and the
    charts opened from the history in one pass (`add_run` today) against one record at a time through the live
    path (`consume`, as `add_run` did before), both with today's parser."""
    from ortlab.runfolder.lines import parse_line
    from ortlab.runfolder.stream import RunSummary, records
    from ortlab.ui.charts import RunMonitor

    def careful() -> None:
        with open(run.dir.metrics_path, "rb") as f:
            for line in f.read().split(b"\n")[:-1]:
                parse_line(line)

    def fast() -> None:
        for _ in records(run.path):
            pass

    def history() -> None:
        RunMonitor(throttle_s=3600).add_run(run, follow=False)

    def per_record() -> None:
        monitor = RunMonitor(throttle_s=3600)
        monitor.summaries[run.id] = RunSummary()  # (folded per record, as add_run's live path does)
        for record in run.dir.records():
            monitor.consume(run.id, record)
        monitor.flush()

    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, fn in (("parse_careful", careful), ("parse_fast", fast), ("open_history", history)):
            cpu, wall = _cpu_wall(fn)
            out.setdefault(f"{name}_cpu_s", []).append(round(cpu, 3))
            out.setdefault(f"{name}_wall_s", []).append(round(wall, 3))
        cpu, wall = _cpu_wall(per_record)
        out.setdefault("open_per_record_cpu_s", []).append(round(cpu, 3))
        out.setdefault("open_per_record_wall_s", []).append(round(wall, 3))
    return out


def bench_many(tmp: Path, runs: int, steps: int, refreshes: int) -> dict:
    """`runs` finished runs of `steps` steps and one live run (2 new steps per refresh) in one runs folder:
    the sidebar's routes (the list until no row is catching up, each run's sparkline read from offset 0, then per
    refresh the list and the live run's new metrics) and the workbench (its comparison opened by `reattach`: every
    run's charts and the table; then per refresh the live run's records drawn and the table rebuilt)."""
    from ortlab.server.runindex import RunIndex, metrics_since
    from ortlab.train.metricswriter import JsonLinesSink
    from ortlab.ui.runs_panel import RunsPanel

    root = tmp / "many"
    for i in range(runs):
        write_run(tmp, f"done-{i:02d}", steps, inside=root)
    live = write_run(tmp, "live", steps, inside=root)
    sink = JsonLinesSink(live.dir.metrics_path)
    step = [steps]

    def grow() -> list[dict]:
        new = []
        for _ in range(2):
            step[0] += 1
            new.append(step_record(step[0]))
            sink(new[-1])
        return new

    index = RunIndex(root)
    list_requests = 0

    def list_open() -> None:
        nonlocal list_requests
        while list_requests < 100:
            list_requests += 1
            if not any(row["catching_up"] for row in index.rows()):
                return

    list_cpu, list_wall = _cpu_wall(list_open)
    offsets: dict[str, int] = {}

    def metrics_open() -> None:
        for folder in index.run_dirs():
            offset = 0
            while (answer := metrics_since(folder, offset, 200))["records"]:
                offset = answer["offset"]
            offsets[folder.id] = offset

    metrics_cpu, metrics_wall = _cpu_wall(metrics_open)
    list_ms, live_ms, done_ms = [], [], []
    done = next(d for d in index.run_dirs() if d.id != live.id)
    for _ in range(refreshes):
        grow()
        list_ms.append(_cpu_wall(index.rows)[1] * 1000)
        t = time.perf_counter()
        answer = metrics_since(live.dir, offsets[live.id], 200)
        live_ms.append((time.perf_counter() - t) * 1000)
        offsets[live.id] = answer["offset"]
        done_ms.append(_cpu_wall(lambda: metrics_since(done, offsets[done.id], 200))[1] * 1000)

    class Panel(RunsPanel):
        def __init__(self, folder: Path):
            self.root = folder
            self._runs_widgets()

    panel = Panel(root)
    compare_cpu, compare_wall = _cpu_wall(panel.reattach)
    refresh_ms = []
    for _ in range(refreshes):

        def refresh(new: list[dict]) -> None:
            for record in new:
                panel.monitor.consume(live.id, record)
            panel.monitor.flush()
            panel.refresh_comparison()

        new = grow()
        refresh_ms.append(_cpu_wall(lambda new=new: refresh(new))[1] * 1000)
    panel.monitor.close()
    sink.close()

    def p50(xs: list[float]) -> float:
        return round(statistics.median(xs), 2)

    return {
        "runs": runs + 1,
        "steps_each": steps,
        "metrics_mb_total": round(sum(f.stat().st_size for f in root.glob("*/metrics.jsonl")) / 2**20, 1),
        "sidebar": {
            "list_open_s": round(list_wall, 3),
            "list_open_cpu_s": round(list_cpu, 3),
            "list_open_requests": list_requests,
            "metrics_open_all_s": round(metrics_wall, 3),
            "metrics_open_all_cpu_s": round(metrics_cpu, 3),
            "list_refresh_ms_p50": p50(list_ms),
            "list_refresh_ms_max": round(max(list_ms), 2),
            "metrics_live_refresh_ms_p50": p50(live_ms),
            "metrics_finished_refresh_ms_p50": p50(done_ms),
        },
        "workbench": {
            "compare_open_s": round(compare_wall, 3),
            "compare_open_cpu_s": round(compare_cpu, 3),
            "refresh_ms_p50": p50(refresh_ms),
            "refresh_ms_max": round(max(refresh_ms), 2),
        },
    }


def main(argv: list[str] | None = None) -> dict:
    from ortlab.server.runindex import DEFAULT_MAX_POINTS, MAX_POINTS_LIMIT
    from ortlab.ui.charts import MAX_POINTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="100 and 1,000 steps, 5 refreshes: seconds")
    parser.add_argument("--refreshes", type=int, default=30)
    parser.add_argument("--many-runs", type=int, default=20, help="finished runs in the many-runs case (+1 live)")
    parser.add_argument("--many-steps", type=int, default=10_000, help="steps of each run in the many-runs case")
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"live-view-{date.today().isoformat()}.json")
    opts = parser.parse_args(argv)
    lengths = [100, 1_000] if opts.smoke else [100, 10_000, 100_000]
    refreshes = 5 if opts.smoke else opts.refreshes
    many_runs, many_steps = (3, 300) if opts.smoke else (opts.many_runs, opts.many_steps)
    load_before = os.getloadavg()

    charts, route = {}, {}
    with tempfile.TemporaryDirectory(prefix="ortlab-live-") as tmp:
        # Warm-up: plotly's first import and figure cost seconds once per process, not per chart.
        bench_charts(write_run(Path(tmp), "warm-up", 10), 10, MAX_POINTS, 1)
        for steps in lengths:
            print(f"[bench] {steps} steps ...", flush=True)
            run = write_run(Path(tmp), f"run-{steps}", steps)
            size = run.dir.metrics_path.stat().st_size
            charts[str(steps)] = {
                "metrics_mb": round(size / 2**20, 2),
                "after": bench_charts(run, steps, MAX_POINTS, refreshes),
            }
            route[str(steps)] = {
                "default": bench_route(run, DEFAULT_MAX_POINTS),
                "sidebar_200": bench_route(run, 200),
                "at_limit": bench_route(run, MAX_POINTS_LIMIT),
            }
        print("[bench] where opening the longest run goes ...", flush=True)
        opening = bench_open(run)
        print(f"[bench] {many_runs} runs of {many_steps} steps and a live one ...", flush=True)
        many = bench_many(Path(tmp), many_runs, many_steps, refreshes)

    import plotly

    report = {
        "benchmark": "bench_live_view",
        "date": date.today().isoformat(),
        "smoke": opts.smoke,
        "what": "kernel-side cost and bytes per refresh of the workbench's charts, in process (no browser); the "
        "metrics route's work (metrics_since, no HTTP) reading a run from offset 0 until caught up; where opening "
        "the longest run goes (CPU s, interleaved); many runs: the list and metrics routes (no HTTP) and the "
        "workbench's comparison, opened and refreshed",
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "plotly": plotly.__version__,
        "chart_max_points": MAX_POINTS,
        "charts": charts,
        "route": route,
        "opening_longest": opening,
        "many_runs": many,
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {opts.out}")
    return report


if __name__ == "__main__":
    main()
