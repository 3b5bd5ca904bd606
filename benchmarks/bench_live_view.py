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


def write_run(root: Path, name: str, steps: int):
    """A completed run folder with `steps` step records (and an eval every 500), as ortlab's sink writes them."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run
    from ortlab.spec import RunSpec
    from ortlab.train.metrics import JsonLinesSink

    run = RunDir.create(root / name, RunSpec(name=name))
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

    started = time.perf_counter()
    monitor = RunMonitor(throttle_s=3600, max_points=max_points)
    monitor.add_run(run, follow=False)
    open_s = time.perf_counter() - started
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
    from ortlab.server.runs import metrics_since

    started = time.perf_counter()
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
        "pages": pages,
        "payload_bytes": size,
        "steps_sent": sent,
    }


def main(argv: list[str] | None = None) -> dict:
    from ortlab.server.runs import DEFAULT_MAX_POINTS, MAX_POINTS_LIMIT
    from ortlab.ui.charts import MAX_POINTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="100 and 1,000 steps, 5 refreshes: seconds")
    parser.add_argument("--refreshes", type=int, default=30)
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"live-view-{date.today().isoformat()}.json")
    opts = parser.parse_args(argv)
    lengths = [100, 1_000] if opts.smoke else [100, 10_000, 100_000]
    refreshes = 5 if opts.smoke else opts.refreshes

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

    import plotly

    report = {
        "benchmark": "bench_live_view",
        "date": date.today().isoformat(),
        "smoke": opts.smoke,
        "what": "kernel-side cost and bytes per refresh of the workbench's charts, in process (no browser); the "
        "metrics route's work (metrics_since, no HTTP) reading a run from offset 0 until caught up",
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "plotly": plotly.__version__,
        "chart_max_points": MAX_POINTS,
        "charts": charts,
        "route": route,
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {opts.out}")
    return report


if __name__ == "__main__":
    main()
