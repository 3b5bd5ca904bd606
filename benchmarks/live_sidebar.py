"""The sidebar's part of bench_live_browser.py (issue #35): what ortlab's runs panel, open in chromium and following
a run, costs that run; and how long the panel takes to draw a long run's sparklines.

The panel is this checkout's prebuilt sidebar (tests/helpers/lab_server.py puts it first on JupyterLab's path). It
polls the server every 500 ms while a run is live: the runs list, then the run's new metrics from its last offset.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from lab_server import open_runs_panel, show_runs_panel, wait_for_lab
from page_errors import PageErrors, watch_page_errors

SPARKLINE_JS = """(run) => {
    const el = document.querySelector(`.ortlab-Run[data-run-id="${run}"] .ortlab-Sparkline-loss`);
    return el ? {first: Number(el.dataset.firstStep), last: Number(el.dataset.lastStep),
                 points: Number(el.dataset.points)} : null;
}"""


def sparkline(page, run: str) -> dict | None:
    """What the run's loss sparkline covers: its first and last step and its points (None while not drawn)."""
    return page.evaluate(SPARKLINE_JS, run)


def followed_by_sidebar(
    browser, url: str, token: str, name: str, steps: int, launch: Callable[[], dict], errors: PageErrors | None = None
) -> dict:
    """`launch()` (the unwatched run, with its CPU meter) while JupyterLab is open in chromium with ortlab's runs
    panel shown: the panel finds the run and follows it. Adds what the panel drew of it at the end. The page's
    errors go to `errors` (tests/helpers/page_errors.py)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    watch_page_errors(page, errors, label=f"sidebar {name}")
    page.set_default_timeout(180_000)  # a loaded 2-core machine: clicks wait on a busy page
    try:
        open_runs_panel(page, url, token)
        row = launch()
        # The run ended: the panel's last poll of it may be up to one interval (500 ms) behind.
        deadline = time.monotonic() + 10
        drawn = sparkline(page, name)
        while (drawn is None or drawn["last"] < steps) and time.monotonic() < deadline:
            time.sleep(0.25)
            drawn = sparkline(page, name)
    finally:
        page.close()
    drawn = drawn or {}
    return {**row, "sidebar_first_step": drawn.get("first"), "sidebar_last_step": drawn.get("last")}


def sidebar_open(
    browser, url: str, token: str, runs_root: Path, lengths: list[int], repeats: int, errors: PageErrors | None = None
) -> dict:
    """Seconds from showing the runs panel to a running run's loss sparkline being drawn whole (its first and its
    newest step), for runs of each length in `lengths`, `repeats` times interleaved, each in a fresh page (a fresh
    model: the panel reads the history from offset 0). The runs are fake (tests/helpers/fake_runs.py: a `running`
    folder this process holds, no training), each stopped after it is measured so that the panel stops polling it.
    The pages' errors go to `errors` (tests/helpers/page_errors.py).
    """
    from fake_runs import make_fake_run

    from ortlab.runfolder.rundir import RunDir

    times: dict[int, list[float]] = {n: [] for n in lengths}
    points: dict[int, int] = {}
    for i in range(repeats):
        for n in lengths:
            name = f"open-{n}-{i}"
            path = make_fake_run(runs_root, name, state="running", steps=n, max_steps=2 * n)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            watch_page_errors(page, errors, label=f"sidebar open {name}")
            page.set_default_timeout(180_000)
            try:
                page.goto(f"{url}/lab?reset&token={token}", timeout=90_000)
                wait_for_lab(page)
                start = time.monotonic()
                show_runs_panel(page)
                page.wait_for_function(
                    f"([run, n]) => {{ const s = ({SPARKLINE_JS})(run); return s && s.first === 1 && s.last === n; }}",
                    arg=[name, n],
                    polling=20,
                    timeout=120_000,
                )
                times[n].append(time.monotonic() - start)
                points[n] = max(points.get(n, 0), sparkline(page, name)["points"])
            finally:
                page.close()
                RunDir(path).set_status("stopped", step=n)
    return {
        "what": "seconds from showing the runs panel to a running run's loss sparkline drawn from its first step to "
        "its newest, in a fresh page; per run length",
        "lengths": lengths,
        "repeats": repeats,
        "seconds": {str(n): [round(t, 3) for t in times[n]] for n in lengths},
        "seconds_median": {str(n): round(statistics.median(times[n]), 3) for n in lengths},
        "points_drawn": {str(n): points[n] for n in lengths},
    }
