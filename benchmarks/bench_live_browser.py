"""What watching a run costs it, in a real browser: the workbench's charts open in chromium, in JupyterLab.

    .venv/bin/python benchmarks/bench_live_browser.py           # 2 rounds of 150-step runs; a 100,000-step follow
    .venv/bin/python benchmarks/bench_live_browser.py --smoke   # 1 round of 12-step runs; a 2,000-step follow

Goal (issue #35): watched/unwatched samples/s >= 0.95 on 2 cores, the browser on the same machine.

Measurements, against one JupyterLab server (a real jupyter_server and kernel) and Debian's chromium:
- runs: the embedded default (150 steps, batch 8, length 32, logging every step), launched from the workbench with
  its charts open in the page (watched: the Launch button), and the same spec launched from this process with no
  page open (unwatched), interleaved: watched, unwatched, watched, unwatched. The run's own `steady_samples_per_s`
  (its summary: steps after the warm-up) is the number; beside it, the CPU seconds the kernel and chromium spent
  while each run went (where the cost would be).
- the floor: the unwatched run again with JupyterLab open in chromium on a notebook that draws nothing
  (`page_open`): what the page costs by itself, so the charts' own cost is watched over page_open.
- the sidebar: the unwatched run again with JupyterLab open in chromium on ortlab's runs panel, which follows it
  (a poll every 500 ms while it is live; `sidebar`, ratio_sidebar = sidebar / unwatched). Every arm also has the
  CPU seconds of the jupyter server (where the sidebar's requests are answered).
- the sidebar opening a run (`sidebar_open`): seconds from showing the panel to a running run's sparkline drawn
  from its first step to its newest, for a 100-step and a 100,000-step run folder (fake runs, no training).
- follow: a run folder of N steps (100,000) that a thread in the kernel extends at a live run's pace (8 steps/s)
  is followed by a `RunMonitor` in the page for `--follow-s` seconds: the browser's drawing time per refresh (what
  livechart.js measures around extendTraces, and reports to the kernel), its frame intervals and long tasks
  (requestAnimationFrame, PerformanceObserver), the kernel's refreshes, bytes and points per refresh and its
  adaptive interval, and the CPU share of the kernel and chromium over the window.

Results go to benchmarks/results/live-browser-<date>.json, with `uptime`'s load beside them (the machine is shared),
and the script errors of every page it opened (`page_errors`, tests/helpers/page_errors.py: none, or its test fails).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from common import cpu_name  # noqa: E402
from cpu_meter import CpuMeter  # noqa: E402
from lab_server import CHROMIUM, CHROMIUM_ARGS, ortlab_lab_options  # noqa: E402
from live_sidebar import followed_by_sidebar, sidebar_open  # noqa: E402
from page_errors import PageErrors, watch_page_errors  # noqa: E402

TOKEN = "ortlab-bench-browser"


def run_spec(name: str, steps: int) -> dict:
    """The issue's run: the embedded model and data, batch 8, length 32, logging every step."""
    return {
        "name": name,
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 8 * steps, "max_eval_samples": 16},
        "hyper": {"max_steps": steps, "batch_size": 8, "max_length": 32, "logging_steps": 1},
    }


def notebook(folder: Path, name: str, source: str) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")
    return f"{name}.ipynb"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- the page ----------------------------------------------------------------------------------------------------


def open_and_run(page, url: str, name: str) -> None:
    """Open a notebook in JupyterLab and run its cell once the kernel is idle."""
    page.goto(f"{url}/lab/tree/{name}?reset&token={TOKEN}", timeout=90_000)  # reset: no earlier tabs
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
    page.click("text=Run >> nth=0")
    page.get_by_text("Run All Cells", exact=True).click()


def shut_down_kernels(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/kernels?token={TOKEN}", timeout=10) as r:
        ids = [k["id"] for k in json.load(r)]
    for kernel_id in ids:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel_id}?token={TOKEN}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


def samples_per_s(run_dir: Path) -> float:
    from ortlab.runfolder.stream import summary_of

    value = summary_of(run_dir).steady_samples_per_s
    if not value:
        raise SystemExit(f"{run_dir.name} has no steady samples/s: {(run_dir / 'status.json').read_text()}")
    return float(value)


def wait_state(run_dir: Path, states: tuple[str, ...], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = json.loads((run_dir / "status.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            state = None
        if state in states:
            return state
        time.sleep(0.5)
    raise SystemExit(f"{run_dir.name} did not reach {states} in {timeout:.0f} s")


def watched(browser, url: str, folder: Path, name: str, steps: int, errors: PageErrors) -> dict:
    source = f"import ortlab\nwb = ortlab.Workbench(spec={run_spec(name, steps)!r}, root='runs')\nwb"
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    watch_page_errors(page, errors, label=name)
    page.set_default_timeout(180_000)  # a loaded 2-core machine: clicks wait on a busy page
    try:
        open_and_run(page, url, notebook(folder, name, source))
        launch = page.locator("button.ortlab-launch")
        launch.wait_for(timeout=120_000)
        page.wait_for_function("() => !document.querySelector('button.ortlab-launch').disabled", timeout=60_000)
        meter = CpuMeter(folder)
        meter.start()
        launch.click()
        run_dir = folder / "runs" / name
        state = wait_state(run_dir, ("completed", "failed", "stopped"), 900)
        cpu = meter.stop()
        drawn = page.evaluate(
            """() => Math.max(0, ...[...document.querySelectorAll('.js-plotly-plot')].flatMap(
                gd => (gd.data || []).map(t => (t.x || []).length)))"""
        )
        render = page.evaluate("() => globalThis.__ortlabRenderMs || []")
    finally:
        page.close()
        shut_down_kernels(url)
    if state != "completed":
        raise SystemExit(f"watched run {name} ended {state}")
    return {"samples_per_s": round(samples_per_s(run_dir), 3), "points_drawn": drawn, **cpu, **_render(render)}


def unwatched(folder: Path, name: str, steps: int) -> dict:
    import ortlab

    meter = CpuMeter(folder)
    meter.start()
    run = ortlab.launch(run_spec(name, steps), root=folder / "runs")
    status = run.wait(timeout=900)
    cpu = meter.stop()
    if status["state"] != "completed":
        raise SystemExit(f"unwatched run {name} ended {status['state']}")
    return {"samples_per_s": round(samples_per_s(run.dir.path), 3), **cpu}


def page_open(browser, url: str, folder: Path, name: str, steps: int, errors: PageErrors) -> dict:
    """The unwatched run again, with JupyterLab open in chromium on a notebook that draws nothing (its kernel
    idle): what an open JupyterLab page costs a run by itself, the floor under the charts' own cost."""
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    watch_page_errors(page, errors, label=f"{name}-page")
    page.set_default_timeout(180_000)
    try:
        open_and_run(page, url, notebook(folder, f"{name}-page", "import ortlab\nortlab.__version__"))
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
        return unwatched(folder, name, steps)
    finally:
        page.close()
        shut_down_kernels(url)


def sidebar(browser, url: str, folder: Path, name: str, steps: int, errors: PageErrors) -> dict:
    """The unwatched run again, with JupyterLab open in chromium on ortlab's runs panel following it."""
    return followed_by_sidebar(browser, url, TOKEN, name, steps, lambda: unwatched(folder, name, steps), errors)


def _mean(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if key in r]
    return round(statistics.mean(values), 3) if values else None


def _render(ms: list[float]) -> dict:
    if not ms:
        return {"render_refreshes": 0}
    ordered = sorted(ms)
    return {
        "render_refreshes": len(ms),
        "render_ms_p50": round(statistics.median(ms), 2),
        "render_ms_p95": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "render_ms_max": round(max(ms), 2),
    }


FOLLOW_CELL = """\
import json, os, threading, time
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run
from ortlab.spec import RunSpec
from ortlab.train.metricswriter import JsonLinesSink
from ortlab.ui import RunMonitor

def record(step):
    import math
    return {{"event": "step", "step": step, "loss": 2.0 / (1 + step / 100) + 0.05 * math.sin(step),
            "samples_per_s": 40.0 + 5 * math.sin(step / 7), "step_time_s": 0.2, "peak_mem_mb": 900.0 + step % 17,
            "samples": 8, "tokens": 256}}

folder = RunDir.create("follow", RunSpec(name="follow"))
folder.update_status(pid=os.getpid(), create_time=process_create_time(os.getpid()))
folder.set_status("running")
sink = JsonLinesSink(folder.metrics_path)
sink({{"event": "train_begin", "accelerations": {{}}}})
for step in range(1, {steps} + 1):
    sink(record(step))
monitor = RunMonitor(Run(folder.path))

def write():
    step = {steps}
    while True:
        for _ in range(4):
            step += 1
            sink(record(step))
            time.sleep(1 / {rate})
        chart = monitor.chart
        stats = {{"refreshes": monitor.updates_sent, "bytes": chart.bytes_sent, "points": monitor.points_sent,
                 "interval_s": chart.interval(monitor.throttle_s), "kernel_ms": 1000 * chart.kernel_s,
                 "render_ms": 1000 * chart.render_s, "steps": step}}
        with open("follow-stats.json.tmp", "w") as f:
            json.dump(stats, f)
        os.replace("follow-stats.json.tmp", "follow-stats.json")

threading.Thread(target=write, daemon=True).start()
monitor
"""

FRAMES_JS = """() => {
    globalThis.__ortlabRenderMs = [];
    const frames = globalThis.__frames = [];
    const long = globalThis.__longTasks = [];
    let last = performance.now();
    const loop = (t) => { frames.push(t - last); last = t; if (!globalThis.__stopFrames) requestAnimationFrame(loop); };
    requestAnimationFrame(loop);
    new PerformanceObserver((list) => { for (const e of list.getEntries()) long.push(e.duration); })
        .observe({ type: "longtask" });
}"""


def follow(browser, url: str, folder: Path, steps: int, seconds: float, rate: float, errors: PageErrors) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    watch_page_errors(page, errors, label="follow")
    page.set_default_timeout(180_000)  # a loaded 2-core machine: clicks wait on a busy page
    stats_path = folder / "follow-stats.json"
    try:
        opened = time.monotonic()
        open_and_run(page, url, notebook(folder, "follow", FOLLOW_CELL.format(steps=steps, rate=rate)))
        page.wait_for_function(
            """(steps) => [...document.querySelectorAll('.js-plotly-plot')].some(
                gd => (gd.data || []).some(t => (t.x || []).length > 0 && t.x[t.x.length - 1] > steps))""",
            arg=steps,
            timeout=600_000,
        )
        first_drawn_s = time.monotonic() - opened
        time.sleep(min(5.0, seconds / 4))  # past the first snapshot
        before = json.loads(stats_path.read_text())
        meter = CpuMeter(folder)
        meter.start()
        page.evaluate(FRAMES_JS)
        time.sleep(seconds)
        page.evaluate("() => { globalThis.__stopFrames = true; }")
        cpu = meter.stop()
        after = json.loads(stats_path.read_text())
        render = page.evaluate("() => globalThis.__ortlabRenderMs")
        frames = page.evaluate("() => globalThis.__frames")
        long_tasks = page.evaluate("() => globalThis.__longTasks")
        drawn = page.evaluate(
            """() => Math.max(0, ...[...document.querySelectorAll('.js-plotly-plot')].flatMap(
                gd => (gd.data || []).map(t => (t.x || []).length)))"""
        )
        page.screenshot(path=str(folder / "follow.png"), full_page=True)
    finally:
        page.close()
        shut_down_kernels(url)
    refreshes = max(1, after["refreshes"] - before["refreshes"])
    ordered = sorted(frames[1:]) or [0.0]
    return {
        "steps_at_start": steps,
        "steps_at_end": after["steps"],
        "steps_per_s": rate,
        "window_s": seconds,
        "first_drawn_s": round(first_drawn_s, 1),
        "points_drawn_max": drawn,
        "refreshes": after["refreshes"] - before["refreshes"],
        "bytes_per_refresh": round((after["bytes"] - before["bytes"]) / refreshes, 1),
        "points_per_refresh": round((after["points"] - before["points"]) / refreshes, 2),
        "steps_per_refresh": round((after["steps"] - before["steps"]) / refreshes, 2),
        "interval_s": round(after["interval_s"], 3),
        "kernel_ms_per_refresh": round(after["kernel_ms"], 3),
        **_render(render),
        "frames": len(frames),
        "frame_ms_p50": round(statistics.median(ordered), 2),
        "frame_ms_p95": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "frame_ms_max": round(max(ordered), 2),
        "long_tasks": len(long_tasks),
        "long_task_ms_total": round(sum(long_tasks), 1),
        **cpu,
    }


def main(argv: list[str] | None = None) -> dict:
    from lab_server import start_lab
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="1 round of 12-step runs, a 2,000-step follow: minutes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--follow-first", action="store_true", help="the follow before the rounds")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--follow-steps", type=int, default=100_000)
    parser.add_argument("--follow-s", type=float, default=60.0)
    parser.add_argument("--open-steps", type=int, default=100_000, help="the long run the sidebar opens")
    parser.add_argument("--open-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"live-browser-{date.today().isoformat()}.json")
    opts = parser.parse_args(argv)
    if opts.smoke:
        opts.rounds, opts.steps, opts.follow_steps, opts.follow_s, opts.open_repeats = 1, 12, 2_000, 8.0, 1
    if not Path(CHROMIUM).exists():
        raise SystemExit("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")

    rounds: list[dict] = []
    followed: dict = {}
    opened: dict = {}
    # Script errors in any of the pages (tests/helpers/page_errors.py): the report lists them, its test fails on them.
    errors = PageErrors()

    def write() -> dict:
        """The report as it stands: written after every round too, so that a run cut short leaves its rounds."""
        ratios = [r["ratio"] for r in rounds]
        report = {
            "benchmark": "bench_live_browser",
            "date": date.today().isoformat(),
            "smoke": opts.smoke,
            "what": "a run's steady samples/s launched from the workbench with its charts open in chromium "
            "(JupyterLab on this machine) against the same spec launched with nothing watching, interleaved; and the "
            "browser's drawing and frame times while a long run is followed",
            "goal": "watched/unwatched >= 0.95",
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "run": run_spec("<name>", opts.steps),
            "rounds": rounds,
            "ratio_mean": round(statistics.mean(ratios), 3) if ratios else None,
            "ratio_page_open_mean": _mean(rounds, "ratio_page_open"),
            "ratio_watched_vs_page_open_mean": _mean(rounds, "ratio_watched_vs_page_open"),
            "ratio_sidebar_mean": _mean(rounds, "ratio_sidebar"),
            "follow": followed,
            "sidebar_open": opened,
            "page_errors": errors.errors,
        }
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(report, indent=2) + "\n")
        return report

    with tempfile.TemporaryDirectory(prefix="ortlab-bench-browser-") as tmp:
        folder = Path(tmp)
        args, env = ortlab_lab_options(folder, folder / "runs")
        with start_lab(folder, TOKEN, args, env) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

            def follow_now() -> None:
                print(f"[bench] following a {opts.follow_steps}-step run for {opts.follow_s:.0f} s ...", flush=True)
                followed["load_before"] = load()
                followed.update(follow(browser, url, folder, opts.follow_steps, opts.follow_s, rate=8.0, errors=errors))
                followed["load_after"] = load()
                write()
                print(f"[bench] the sidebar opening 100- and {opts.open_steps}-step runs ...", flush=True)
                opened["load_before"] = load()
                lengths = [100, opts.open_steps]
                opened.update(sidebar_open(browser, url, TOKEN, folder / "runs", lengths, opts.open_repeats, errors))
                opened["load_after"] = load()
                write()
                shot = folder / "follow.png"
                if shot.exists():
                    (ROOT / "test-artifacts").mkdir(exist_ok=True)
                    shutil.copy(shot, ROOT / "test-artifacts" / "live-follow.png")

            try:
                if opts.follow_first:
                    follow_now()
                for i in range(opts.rounds):
                    row = {"load_before": load()}
                    print(f"[bench] round {i + 1}: watched ...", flush=True)
                    row["watched"] = watched(browser, url, folder, f"watched-{i}", opts.steps, errors)
                    print(f"[bench] round {i + 1}: unwatched ...", flush=True)
                    row["unwatched"] = unwatched(folder, f"unwatched-{i}", opts.steps)
                    print(f"[bench] round {i + 1}: JupyterLab open, nothing drawn ...", flush=True)
                    row["page_open"] = page_open(browser, url, folder, f"page-{i}", opts.steps, errors)
                    print(f"[bench] round {i + 1}: JupyterLab open, the sidebar following ...", flush=True)
                    row["sidebar"] = sidebar(browser, url, folder, f"sidebar-{i}", opts.steps, errors)
                    arms = ("watched", "unwatched", "page_open", "sidebar")
                    speed = {k: row[k]["samples_per_s"] for k in arms}
                    row["ratio"] = round(speed["watched"] / speed["unwatched"], 3)
                    # The floor: an open JupyterLab page alone; and the charts' own cost above it.
                    row["ratio_page_open"] = round(speed["page_open"] / speed["unwatched"], 3)
                    row["ratio_watched_vs_page_open"] = round(speed["watched"] / speed["page_open"], 3)
                    row["ratio_sidebar"] = round(speed["sidebar"] / speed["unwatched"], 3)
                    row["load_after"] = load()
                    print(f"[bench] {json.dumps(row)}", flush=True)
                    rounds.append(row)
                    write()
                if not opts.follow_first:
                    follow_now()
            finally:
                browser.close()
    report = write()
    print(f"written to {opts.out}")
    return report


if __name__ == "__main__":
    main()
