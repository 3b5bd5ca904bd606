"""A new user's first minutes (issue #42): the doctor cold and warm, a bad spec refused, Launch in the workbench.

    .venv/bin/python benchmarks/bench_first_minutes.py                 # this CPU as it is
    .venv/bin/python benchmarks/bench_first_minutes.py --no-bf16       # as a CPU without bf16 hardware
    .venv/bin/python benchmarks/bench_first_minutes.py --skip-browser  # the command-line part only

`--no-bf16` makes this machine a CPU without bf16 units for real where it matters: oneDNN's bf16 kernels off
(ONEDNN_MAX_CPU_ISA=AVX2: a bf16 matmul then runs ~100x slower than fp32, as on the AMD EPYC of the issue) and the
avx512_bf16/amx_bf16 flags hidden from ortlab (ORTLAB_HIDE_CPU_FLAGS). Everything runs with a doctor cache of its
own (a new user's: empty at first) and the machine's ortlab runtimes.

Measured, each a wall time with the machine's load beside it (the machine may be shared):
- `ortlab doctor --json` cold (empty cache: every probe group, the matmul peak, the compile runtime's groups) and
  warm (the best and the median of 5; goal <= 1 s, Python's start included), and what the cache holds: each group's
  outcome and probe time;
- `ortlab train --data missing.csv`: refused with ortlab's words (goal <= 10 s, Python's start included);
- the workbench in JupyterLab in chromium (a real jupyter_server and kernel), the embedded model and data: from the
  Launch click to status.json's `running` (goal <= 3 s) and to the first point of the loss chart (goal <= 15 s),
  for the first Launch in an environment never probed (the launch probes what it needs, once, with its progress in
  the page) and for the next one (warm); every page error the page logged (goal: none).

Results go to benchmarks/results/first-minutes-<date>[-no-bf16].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from common import cpu_name, write_report  # noqa: E402

ORTLAB = str(Path(sys.executable).parent / "ortlab")
NO_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ORTLAB_HIDE_CPU_FLAGS": "avx512_bf16,amx_bf16"}
GOALS = {"doctor_warm_s": 1.0, "refused_s": 10.0, "launch_to_running_s": 3.0, "launch_to_first_point_s": 15.0}
TOKEN = "ortlab-bench-first-minutes"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    return round(time.monotonic() - started, 3), out


def doctor(env: dict[str, str], folder: Path) -> dict:
    cold_s, out = timed([ORTLAB, "doctor", "--json"], env, folder, 600)
    if out.returncode != 0:
        raise SystemExit(f"ortlab doctor failed:\n{out.stderr}")
    cold = json.loads(out.stdout)
    warm = []
    for _ in range(5):
        seconds, again = timed([ORTLAB, "doctor", "--json"], env, folder, 120)
        if not json.loads(again.stdout)["cached"]:
            raise SystemExit(f"the second doctor probed again:\n{again.stderr}")
        warm.append(seconds)
    peaks = cold.get("peaks", {}).get("precisions", {})
    return {
        "cold_s": cold_s,
        "warm_s": warm,
        "warm_best_s": min(warm),
        "warm_median_s": statistics.median(warm),
        "groups": {g: {"outcome": a["outcome"], "seconds": a["seconds"]} for g, a in cold["groups"].items()},
        "runtimes": {name: rt.get("ready") for name, rt in cold.get("runtimes", {}).items()},
        "notes": cold["notes"],
        "peaks": {
            p: {k: v.get(k) for k in ("flops", "size", "hardware", "seconds", "repeats", "error")}
            for p, v in peaks.items()
        },
        "bf16": {k: cold["accelerations"]["bf16"][k] for k in ("available", "slow", "reason")},
    }


def refused(env: dict[str, str], folder: Path) -> dict:
    seconds, out = timed(
        [ORTLAB, "train", "--data", str(folder / "missing.csv"), "--output-dir", str(folder / "runs")],
        {**env, "COLUMNS": "80"},
        folder,
        300,
    )
    said = out.stderr.strip().splitlines()[-1:] or [""]
    return {"seconds": seconds, "exit_code": out.returncode, "said": said[0], "probed": "probing" in out.stderr}


# --- the workbench in chromium -----------------------------------------------------------------------------------


def browser_launches(env: dict[str, str], folder: Path) -> dict:
    """Two workbenches, one Launch each: the first in an environment the doctor never probed, then a warm one."""
    import nbformat
    from lab_server import CHROMIUM, CHROMIUM_ARGS, start_lab
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with start_lab(folder, TOKEN, extra_env=env) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for name in ("first", "warm"):
                out[name] = _launch_once(browser, url, folder, f"launch-{name}", nbformat)
        finally:
            browser.close()
    return out


def _launch_once(browser, url: str, folder: Path, name: str, nbformat) -> dict:
    spec = {
        "name": name,
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 800, "max_eval_samples": 32},
        "hyper": {"max_steps": 100000, "batch_size": 8, "max_length": 48, "logging_steps": 5},
    }
    nb = nbformat.v4.new_notebook()
    # A runs folder of its own: a workbench shows the runs it finds there (the first Launch's chart is not this one's).
    nb.cells = [nbformat.v4.new_code_cell(f"import ortlab\nwb = ortlab.Workbench(spec={spec!r}, root={name!r})\nwb")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{name}.ipynb")
    from lab_server import stop_if_running
    from page_errors import watch_page_errors

    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    errors = watch_page_errors(page, label=name).errors
    status = folder / name / name / "status.json"
    try:
        page.goto(f"{url}/lab/tree/{name}.ipynb?reset&token={TOKEN}", timeout=120_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=180_000)
        page.click("text=Run >> nth=0")
        page.get_by_text("Run All Cells", exact=True).click()
        launch = page.locator("button.ortlab-launch")
        launch.wait_for(timeout=180_000)
        page.wait_for_function("() => !document.querySelector('button.ortlab-launch').disabled", timeout=60_000)
        clicked = time.monotonic()
        launch.click()
        running = first_point = None
        shown: list[str] = []
        while time.monotonic() - clicked < 600 and first_point is None:
            now = time.monotonic() - clicked
            if running is None and _state(status) == "running":
                running = round(now, 2)
            if _points(page):
                first_point = round(now, 2)
            message = page.evaluate("() => (document.querySelector('.ortlab-workbench') || {}).innerText || ''").split(
                "\n"
            )
            said = [line.strip() for line in message if "probing" in line or (" in " in line and ": ok" in line)]
            shown += [line for line in said if line not in shown]
            time.sleep(0.1)
    finally:
        page.close()
        stop_if_running(folder / name / name)
    return {
        "launch_to_running_s": running,
        "launch_to_first_point_s": first_point,
        "progress_shown": shown[:10],
        "page_errors": errors,
    }


def _state(status: Path) -> str | None:
    try:
        return json.loads(status.read_text())["state"]
    except (OSError, ValueError, KeyError):
        return None


def _points(page) -> int:
    return page.evaluate(
        """() => {
            for (const gd of document.querySelectorAll('.js-plotly-plot'))
                for (const t of gd.data || []) if ((t.name || '').endsWith('(train)') && t.x) return t.x.length;
            return 0;
        }"""
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-bf16", action="store_true", help="simulate a CPU without bf16 hardware (see above)")
    parser.add_argument("--skip-browser", action="store_true", help="the command-line part only")
    parser.add_argument("--output", help="where to write the JSON (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    from ortlab.runtimes import runtimes_dir

    report: dict = {
        "benchmark": "first-minutes",
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "simulated": "a CPU without bf16 hardware (ONEDNN_MAX_CPU_ISA=AVX2, flags hidden)" if args.no_bf16 else None,
        "load_1min_5min_15min_at_start": load(),
        "goals": GOALS,
    }
    with tempfile.TemporaryDirectory(prefix="ortlab-first-minutes-") as tmp:
        folder = Path(tmp)
        env = {
            **os.environ,
            "ORTLAB_CACHE_DIR": str(folder / "cache"),  # a new user's: empty
            "ORTLAB_RUNTIMES_DIR": str(runtimes_dir()),  # the runtimes this machine has
            **(NO_BF16 if args.no_bf16 else {}),
        }
        print("[first-minutes] the doctor, cold then warm ...", flush=True)
        report["doctor"] = doctor(env, folder)
        print("[first-minutes] a bad spec ...", flush=True)
        report["refused"] = refused(env, folder)
        if not args.skip_browser:
            print("[first-minutes] the workbench in chromium (a fresh doctor cache) ...", flush=True)
            env["ORTLAB_CACHE_DIR"] = str(folder / "browser-cache")
            report["workbench"] = browser_launches(env, folder / "lab")
    report["load_1min_5min_15min_at_end"] = load()
    met = {
        "doctor_warm_s": report["doctor"]["warm_median_s"] <= GOALS["doctor_warm_s"],
        "refused_s": report["refused"]["seconds"] <= GOALS["refused_s"] and report["refused"]["exit_code"] != 0,
    }
    if "workbench" in report:
        warm = report["workbench"]["warm"]
        met["launch_to_running_s"] = (warm["launch_to_running_s"] or 1e9) <= GOALS["launch_to_running_s"]
        met["launch_to_first_point_s"] = (warm["launch_to_first_point_s"] or 1e9) <= GOALS["launch_to_first_point_s"]
        met["no_page_error"] = not any(r["page_errors"] for r in report["workbench"].values())
    report["meets_goals"] = met
    suffix = "-no-bf16" if args.no_bf16 else ""
    path = write_report(report, args.output, f"first-minutes-{report['date']}{suffix}.json")
    print(json.dumps({k: report[k] for k in ("doctor", "refused", "meets_goals")}, indent=1)[:3000])
    print(f"[first-minutes] written to {path}")
    return report


if __name__ == "__main__":
    main()
