"""The workbench in a real browser on ipywidgets 7: Colab's widget generation, in the classic notebook 6.5 (#43).

tests/test_browser.py drives the workbench in JupyterLab on ipywidgets 8 (ortlab's own venv). Colab's runtime has
ipywidgets 7.7.1, whose front end (widgetsnbextension 3.6, jupyter-js-widgets) is another code base, and whose
Python side displays widgets another way (`_ipython_display_`, no `_repr_mimebundle_`): a view can pass every
kernel-side check (tests/test_widget_generations.py reads the outputs the kernel sent) and still fail to draw, or
throw, in that front end. So the same drive, here: the Colab-like venv (tests/helpers/colablike.py: Python 3.12,
Colab's kernel pins, notebook 6.5.7, ipywidgets 7.7.1, plotly 5.24.1) gets ortlab installed from this checkout as
the notebooks' install cell does, serves the classic notebook with its own `jupyter notebook`, and chromium runs a
cell that creates the workbench: it renders, Launch starts a run, the live chart (ortlab's anywidget, through
anywidget's nbextension) gains points while the run folder says running, and Stop ends the run `stopped`. A script
error in the page fails it (tests/helpers/page_errors.py). The screenshot goes to
test-artifacts/workbench-ipywidgets7.png and the times of each step to test-artifacts/browser-widgets7-times.json.

Lean for CI: one install into a hard-linked copy of the cached venv, one server, one run, short waits that say what
they waited for."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
from colablike import bare_env, colab_like_venv, copy_of, versions
from conftest import ROOT
from lab_server import CHROMIUM, CHROMIUM_ARGS, free_port, stop_if_running
from page_errors import assert_no_page_errors, wait_until, watch_page_errors
from test_browser import _points, _states_shown

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "ortlab-widgets7-test"
KERNEL = "colab-like"

NOTEBOOK_SOURCE = """\
import ortlab, ipywidgets
print("ipywidgets", ipywidgets.__version__)
wb = ortlab.Workbench(
    spec={
        "name": "widgets7-run",
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 800, "max_eval_samples": 32},
        "hyper": {"max_steps": 100000, "batch_size": 8, "max_length": 48, "logging_steps": 5},
    },
    root="runs",
)
wb"""


def _install_ortlab(python: Path) -> None:
    """ortlab from this checkout into the host, as the notebooks' install cell does (`ortlab[ui] @ <source>`)."""
    env = {**bare_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [str(python), "-m", "pip", "install", "-q", f"ortlab[ui] @ {ROOT.resolve().as_uri()}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"installing ortlab into the Colab-like venv failed:\n{done.stderr[-3000:]}"


def _kernel_spec(python: Path, data: Path) -> None:
    """A kernelspec that starts the host's own ipykernel, PYTHONPATH emptied (ortlab comes from the host's venv)."""
    spec = data / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Colab-like", "language": "python", "env": {"PYTHONPATH": ""}})
    )


def _start_notebook(venv: Path, folder: Path) -> tuple[subprocess.Popen, str]:
    """The host's classic notebook (6.5) on a free loopback port with a token, serving `folder`; its URL once it
    answers. Its log goes to folder/notebook.log."""
    data = folder / "jupyter-data"
    _kernel_spec(venv / "bin" / "python", data)
    env = {
        **bare_env(),
        "HF_HUB_OFFLINE": "1",
        "JUPYTER_PATH": str(data),
        "JUPYTER_CONFIG_DIR": str(folder / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(folder / "jupyter-runtime"),
    }
    port = free_port()
    log = (folder / "notebook.log").open("w")
    server = subprocess.Popen(
        [
            str(venv / "bin" / "python"),  # (not bin/jupyter: its #! names the cached venv's python, whose prefix
            "-m",  # has not the nbextensions the install added: anywidget's, which the live chart needs)
            "notebook",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--NotebookApp.token={TOKEN}",
            f"--NotebookApp.notebook_dir={folder}",
            "--NotebookApp.allow_root=True",
        ],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2) as r:
                json.load(r)
            return server, url
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                log_text = (folder / "notebook.log").read_text()
                raise AssertionError(f"the classic notebook did not start:\n{log_text}") from None
            time.sleep(0.5)


def _stop_notebook(server: subprocess.Popen) -> None:
    """Stop the server and the kernels it started (its child processes, found by the server's pid)."""
    try:
        children = psutil.Process(server.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_workbench_on_ipywidgets7_in_the_classic_notebook(tmp_path):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    times: dict[str, float] = {}
    start = time.monotonic()

    def lap(name: str) -> None:
        times[name] = round(time.monotonic() - start, 1)

    base, built_s = colab_like_venv()
    times["venv_build_s"] = round(built_s, 1)  # 0 when it was cached
    venv = copy_of(base, tmp_path / "venv")
    _install_ortlab(venv / "bin" / "python")
    found = versions(venv / "bin" / "python", ("ipywidgets", "widgetsnbextension", "notebook", "plotly", "anywidget"))
    assert found["ipywidgets"].startswith("7.") and found["notebook"].startswith("6.5"), found
    lap("installed_at_s")

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(NOTEBOOK_SOURCE)]
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Colab-like", "language": "python"}
    nbformat.write(nb, tmp_path / "workbench.ipynb")
    server, url = _start_notebook(venv, tmp_path)
    lap("server_up_at_s")
    ARTIFACTS.mkdir(exist_ok=True)
    status_path = tmp_path / "runs" / "widgets7-run" / "status.json"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            errors = watch_page_errors(page)
            try:
                page.goto(f"{url}/notebooks/workbench.ipynb?token={TOKEN}", timeout=60_000)
                # The kernel connected and idle, and the widget manager loaded (widgetsnbextension's), before the
                # cell runs: a widget message with no manager to take it draws nothing.
                page.wait_for_function(
                    """() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel
                        && Jupyter.notebook.kernel.is_connected() && Jupyter.notebook.kernel.widget_manager
                        && document.querySelector('#kernel_indicator_icon.kernel_idle_icon')""",
                    timeout=90_000,
                )
                lap("kernel_ready_at_s")
                page.evaluate("() => Jupyter.notebook.execute_all_cells()")
                launch = page.locator("button.ortlab-launch")
                launch.wait_for(timeout=120_000)
                page.wait_for_function("() => !document.querySelector('button.ortlab-launch').disabled", timeout=60_000)
                shown = page.locator(".output_subarea").first.inner_text()
                assert "ipywidgets 7." in shown, f"the kernel did not run ipywidgets 7: {shown[:200]!r}"
                # Every button's label fits: ipywidgets 7's buttons shrink in a row where ipywidgets 8's did not, and
                # cut "check this machine" to "check this …" beside the mix's long note.
                cut = page.evaluate(
                    """() => [...document.querySelectorAll('.ortlab-workbench button')]
                        .filter(b => b.scrollWidth > b.clientWidth + 1).map(b => b.textContent.trim())"""
                )
                assert cut == [], f"buttons whose label is cut off on ipywidgets 7: {cut}"
                lap("rendered_at_s")
                launch.click()
                first = wait_until(lambda: _points(page), 240, "the first point of the loss chart")
                lap("first_point_at_s")
                assert json.loads(status_path.read_text())["state"] == "running"
                wait_until(lambda: "running" in _states_shown(page), 60, "the runs table to show 'running'")
                # A live change: the chart grows while the run (100000 steps) still goes.
                wait_until(lambda: _points(page) >= first + 3, 120, "the loss chart to grow")
                assert json.loads(status_path.read_text())["state"] == "running", "the chart grew while it ran"
                lap("grew_at_s")
                page.screenshot(path=str(ARTIFACTS / "workbench-ipywidgets7.png"), full_page=True)
                page.locator("button.ortlab-stop").click()
                wait_until(lambda: json.loads(status_path.read_text())["state"] == "stopped", 180, "the run to stop")
                wait_until(lambda: "stopped" in _states_shown(page), 60, "the runs table to show 'stopped'")
                lap("stopped_at_s")
                assert_no_page_errors(errors)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "workbench-ipywidgets7-failure.png"), full_page=True)
                raise
            finally:
                browser.close()
    finally:
        stop_if_running(status_path.parent)
        _stop_notebook(server)
        lap("total_s")
        (ARTIFACTS / "browser-widgets7-times.json").write_text(json.dumps({**times, "host": found}, indent=1))
