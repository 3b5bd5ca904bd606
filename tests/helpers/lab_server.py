"""A real JupyterLab server for the browser tests: loopback, a free port, a token, no news toasts; and the
chromium they drive it with."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Debian's chromium (Playwright cannot download its own here), headless, with nothing of its own on the network.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def start_lab(
    folder: Path, token: str, extra_args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start JupyterLab serving `folder` and yield its URL once it answers; stop it afterwards.

    JupyterLab's own settings for this server: no "get notified about official Jupyter news?" toast over the page,
    no update check (the machine is offline anyway). Its output goes to folder/jupyter.log, shown if it fails.
    """
    settings = folder / "lab-settings"
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "JUPYTER_CONFIG_DIR": str(folder / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(folder / "jupyter-runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        **(extra_env or {}),
    }
    log_path = folder / "jupyter.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={folder}",
            "--ServerApp.allow_root=True",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *extra_args,
        ],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("JupyterLab did not start:\n" + log_path.read_text()[-3000:]) from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# This checkout's prebuilt sidebar (scripts/dev builds it from extension/).
LABEXTENSION = Path(__file__).resolve().parents[2] / "ortlab" / "labextension"


def ortlab_lab_options(folder: Path, runs_root: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """`start_lab`'s extra arguments and environment for JupyterLab with ortlab's sidebar: the server extension on
    (runs root: `runs_root`) and this checkout's prebuilt sidebar first on the labextensions path (JUPYTER_PATH wins
    over the copy installed in the venv, which may be another checkout's)."""
    assert (LABEXTENSION / "package.json").is_file(), "the sidebar is not built: run scripts/dev setup"
    data = folder / "jupyter-data" / "labextensions"
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "ortlab-sidebar").exists():
        (data / "ortlab-sidebar").symlink_to(LABEXTENSION, target_is_directory=True)
    config = folder / "jupyter-config"
    config.mkdir(exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"ortlab": True}}})
    )
    root = str(LABEXTENSION.parents[1])
    extra_env = {
        "JUPYTER_PATH": str(folder / "jupyter-data"),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    return (f"--Ortlab.runs_root={runs_root}",), extra_env


def open_runs_panel(page, url: str, token: str):
    """Load JupyterLab in `page` (its default layout: `reset`), wait until it is ready, and show ortlab's runs panel
    from the command palette. Returns the panel's locator."""
    page.goto(f"{url}/lab?reset&token={token}", timeout=90_000)
    wait_for_lab(page)
    return show_runs_panel(page)


def wait_for_lab(page) -> None:
    """JupyterLab's shell is up, its splash gone, and ortlab's tab in the left bar."""
    page.wait_for_selector(".jp-LabShell", timeout=90_000)
    page.wait_for_function("() => !document.querySelector('#jupyterlab-splash')", timeout=90_000)
    page.wait_for_selector('.jp-SideBar [data-id="ortlab-runs"]', timeout=60_000)


def show_runs_panel(page):
    """Show ortlab's runs panel from the command palette (the panel polls the server while it is shown).

    The shortcut toggles the palette, and a keypress that lands before the page has focus is lost: pressed again
    until the palette's input shows (a lost one kept a benchmark waiting 180 s on a busy machine)."""
    palette = page.locator(".lm-CommandPalette-input")
    for _ in range(6):
        if not palette.is_visible():
            page.keyboard.press("Control+Shift+C")
        try:
            palette.wait_for(state="visible", timeout=10_000)
            break
        except Exception:  # (playwright's TimeoutError)
            continue
    palette.fill("ortlab: Show runs")
    page.keyboard.press("Enter")
    panel = page.locator("#ortlab-runs")
    panel.wait_for(state="visible", timeout=30_000)
    return panel


def stop_if_running(run_dir: Path) -> None:
    """Whatever a browser test or benchmark did, leave no run behind (theirs have 100,000 steps)."""
    if not (run_dir / "status.json").exists():
        return
    from ortlab.runner import attach

    run = attach(run_dir)
    if run.state in ("pending", "running"):
        run.stop(timeout=120)
