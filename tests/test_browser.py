"""The workbench in a real browser: JupyterLab (a real jupyter_server and kernel) driven by Debian's chromium.

The test opens a notebook that creates the workbench, launches a tiny run of the embedded model and dataset
with the Launch button, and watches the loss chart gain points while the run goes. A screenshot is kept in
test-artifacts/ (uploaded by CI with the executed notebooks).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import PYTHON, ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "ortlab-browser-test"

NOTEBOOK_SOURCE = """\
import ortlab
wb = ortlab.Workbench(
    spec={
        "name": "browser-run",
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 800, "max_eval_samples": 32},
        "hyper": {"max_steps": 60, "batch_size": 8, "max_length": 48, "logging_steps": 5},
    },
    root="runs",
)
wb"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyter_lab(tmp_path):
    """A real JupyterLab server on a free loopback port, serving tmp_path, with the venv's kernel."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(NOTEBOOK_SOURCE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "workbench.ipynb")
    port = _free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
    }
    log = (tmp_path / "jupyter.log").open("w")
    server = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={tmp_path}",
            "--ServerApp.allow_root=True",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2) as r:
                json.load(r)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                log_text = (tmp_path / "jupyter.log").read_text()[-3000:]
                raise AssertionError("JupyterLab did not start:\n" + log_text) from None
            time.sleep(0.5)
    yield url, tmp_path
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _points(page) -> int:
    """Markers drawn in the first subplot's first trace (the train loss) of the plotly chart."""
    return page.evaluate(
        """() => {
            const traces = document.querySelectorAll('.js-plotly-plot .scatterlayer .trace');
            return traces.length ? traces[0].querySelectorAll('path.point').length : 0;
        }"""
    )


def test_workbench_launches_a_run_and_the_loss_chart_grows(jupyter_lab):
    from playwright.sync_api import sync_playwright

    url, folder = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
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
            launch.click()
            deadline = time.monotonic() + 300
            first = 0
            while time.monotonic() < deadline and first == 0:
                first = _points(page)
                time.sleep(0.5)
            assert first > 0, "the loss chart never showed a point"
            running_seen = (folder / "runs" / "browser-run" / "status.json").exists()
            later = first
            while time.monotonic() < deadline and later <= first:
                later = _points(page)
                time.sleep(0.5)
            page.screenshot(path=str(ARTIFACTS / "workbench.png"), full_page=True)
            assert later > first, f"the chart did not grow while the run went ({first} -> {later} points)"
            assert running_seen
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "workbench-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    status = json.loads((folder / "runs" / "browser-run" / "status.json").read_text())
    if status["state"] in ("pending", "running"):
        from ortlab.runner import attach

        attach(folder / "runs" / "browser-run").stop(timeout=120)
