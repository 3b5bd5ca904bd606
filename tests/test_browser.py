"""The workbench in a real browser: JupyterLab (a real jupyter_server and kernel) driven by Debian's chromium.

The test opens a notebook that creates the workbench, launches a run of the embedded model and dataset with
the Launch button, watches the loss chart gain points while the run goes (the run folder and the page both say
"running" then), and stops it with the Stop button. The run has far more steps than the test waits for, so it
cannot end before the checks see it running, however fast the machine. A script error in the page fails it
(tests/helpers/page_errors.py: each live chart's view threw one that no other check saw, #42). A screenshot is kept
in test-artifacts/ (uploaded by CI with the executed notebooks); docs/workbench.png, the README's picture, is a copy
of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from lab_server import CHROMIUM, CHROMIUM_ARGS, start_lab, stop_if_running
from page_errors import assert_no_page_errors, wait_until, watch_page_errors

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "ortlab-browser-test"

NOTEBOOK_SOURCE = """\
import ortlab
wb = ortlab.Workbench(
    spec={
        "name": "browser-run",
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 800, "max_eval_samples": 32},
        "hyper": {"max_steps": 100000, "batch_size": 8, "max_length": 48, "logging_steps": 5},
    },
    root="runs",
)
wb"""


@pytest.fixture
def jupyter_lab(tmp_path):
    """A real JupyterLab server on a free loopback port, serving tmp_path, with the venv's kernel."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(NOTEBOOK_SOURCE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "workbench.ipynb")
    with start_lab(tmp_path, TOKEN) as url:
        yield url, tmp_path


def _points(page) -> int:
    """Points of the train-loss trace of the plotly chart, read from the graph's own data (the eval trace, with
    its one point per evaluation, does not count: it does not grow while the run trains)."""
    return page.evaluate(
        """() => {
            for (const gd of document.querySelectorAll('.js-plotly-plot')) {
                for (const trace of gd.data || []) {
                    if ((trace.name || '').endsWith('(train)') && trace.x) return trace.x.length;
                }
            }
            return 0;
        }"""
    )


def _states_shown(page) -> list[str]:
    """The `state` cells of the workbench's runs table, as the page shows them."""
    return page.evaluate(
        """() => {
            const table = document.querySelector('.ortlab-workbench table');
            if (!table) return [];
            const heads = [...table.querySelectorAll('th')].map(th => th.textContent.trim());
            const col = heads.indexOf('state');
            return col < 0 ? [] : [...table.querySelectorAll('tbody tr, tr')]
                .map(tr => tr.querySelectorAll('td')[col]).filter(Boolean).map(td => td.textContent.trim());
        }"""
    )


def _peak(note: str) -> float:
    """The peak memory (MiB) the estimate beside Launch shows; 0 while it shows none."""
    found = re.search(r"peak memory ≈ ([\d.]+) (MiB|GiB)", note)
    return float(found[1]) * (1024 if found[2] == "GiB" else 1) if found else 0.0


def test_workbench_launches_a_run_and_the_loss_chart_grows(jupyter_lab):
    from playwright.sync_api import sync_playwright

    url, folder = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        errors = watch_page_errors(page)
        try:
            page.goto(f"{url}/lab/tree/workbench.ipynb?token={TOKEN}", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            # The kernel must be connected and idle before the cell runs, or the run request goes nowhere.
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
            launch = page.locator("button.ortlab-launch")
            for _attempt in range(3):
                page.click("text=Run >> nth=0")
                page.get_by_text("Run All Cells", exact=True).click()
                try:
                    launch.wait_for(timeout=120_000)
                    break
                except Exception:
                    continue
            launch.wait_for(timeout=10_000)
            page.wait_for_function("() => !document.querySelector('button.ortlab-launch').disabled", timeout=60_000)
            # Beside Launch, the estimate of the spec the form says; it follows a change of the batch size.
            note = page.locator(".ortlab-estimate")
            wait_until(lambda: _peak(note.inner_text()) > 0, 90, "the estimate beside Launch")
            before = note.inner_text()
            batch = page.locator(".widget-inline-hbox").filter(has=page.get_by_text("batch size", exact=True))
            box = batch.locator("input")
            chosen = box.input_value()
            box.fill("512")
            box.press("Enter")
            wait_until(lambda: _peak(note.inner_text()) > _peak(before), 60, "the estimate to follow the batch size")
            bigger = note.inner_text()
            box.fill(chosen)
            box.press("Enter")  # (the memory available moves between estimates: compare the peaks)
            wait_until(lambda: _peak(note.inner_text()) < _peak(bigger), 60, "the estimate of the chosen batch again")
            launch.click()
            status_path = folder / "runs" / "browser-run" / "status.json"
            first = wait_until(lambda: _points(page), 300, "the first point of the loss chart")
            # The run has 100000 steps: it is running now, and the page and the run folder both say so.
            assert json.loads(status_path.read_text())["state"] == "running"
            wait_until(lambda: "running" in _states_shown(page), 60, "the runs table to show 'running'")
            # Growing while it runs; a dozen points make the picture in the README (docs/workbench.png) readable.
            later = wait_until(lambda: _points(page) >= first + 10 and _points(page), 300, "the loss chart to grow")
            assert later > first
            assert json.loads(status_path.read_text())["state"] == "running", "the chart grew while it ran"
            assert page.get_by_text("official Jupyter news").count() == 0, "the news toast covers the page"
            page.screenshot(path=str(ARTIFACTS / "workbench.png"), full_page=True)
            # The same page in JupyterLab's dark theme (for eyes: hard-coded colours show up here).
            page.click("text=Settings >> nth=0")
            page.hover("text=Theme")
            page.get_by_text("JupyterLab Dark", exact=True).click()
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
            # A theme change shows JupyterLab's splash until the new theme is in: wait for the page underneath.
            page.wait_for_function("() => !document.querySelector('#jupyterlab-splash')", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "workbench-dark.png"), full_page=True)
            # Stop from the page: the run finishes its step, saves a checkpoint and ends `stopped`.
            page.locator("button.ortlab-stop").click()
            wait_until(lambda: json.loads(status_path.read_text())["state"] == "stopped", 300, "the run to stop")
            wait_until(lambda: "stopped" in _states_shown(page), 60, "the runs table to show 'stopped'")
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "workbench-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
            stop_if_running(folder / "runs" / "browser-run")
