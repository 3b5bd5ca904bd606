"""Other versions of a few packages, for the tests that check ortlab on what a notebook host has (ipywidgets 7 and
plotly 5 as on Colab; the lowest transformers pyproject.toml declares): installed with `--no-deps` into a folder of
their own (test-artifacts/overlays/NAME, once per clone: seconds from the registry), never into ortlab's
environment. A test puts that folder first on a child's PYTHONPATH (a kernel, a subprocess), so the child imports the
overlay's versions and everything else from ortlab's environment, as trl-site does for trl (tests/helpers/trlsite.py).

The folder records the list it was installed from (`.packages`): a changed pin reinstalls it. Two xdist workers may
ask at once: a lock file keeps it to one install."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
OVERLAYS = ROOT / "test-artifacts" / "overlays"

# Colab's widget generation (ipywidgets 7.7.1 with its front-end packages of that line, plotly 5.24.1; see
# requirements/colab-like.txt). ipywidgets 7 imports ipython_genutils, which ortlab's environment does not hold.
IPYWIDGETS_7 = [
    "ipywidgets==7.7.1",
    "widgetsnbextension==3.6.10",
    "jupyterlab_widgets==1.1.11",
    "ipython_genutils==0.2.0",
    "plotly==5.24.1",
]


def installed(folder: Path, packages: list[str], no_deps: bool = True) -> Path:
    """`folder` holding `packages` (pip's --target), installed when missing or when the list changed; fails the test
    with the command when they cannot be installed. `no_deps`: the packages only (ortlab's environment has the rest);
    else with whatever they need that the folder lacks."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    wanted = "\n".join(packages) + ("\n" if no_deps else "\n(with dependencies)\n")
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = folder / ".packages"
        if not record.is_file() or record.read_text() != wanted:
            shutil.rmtree(folder, ignore_errors=True)
            uv = ROOT / ".venv" / "bin" / "uv"
            uv_cmd = str(uv) if uv.exists() else shutil.which("uv") or "uv"
            cmd = [uv_cmd, "pip", "install", "--target", str(folder), *(["--no-deps"] if no_deps else []),
                   "--python", sys.executable, *packages]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"installing {' '.join(packages)} failed; run: {' '.join(cmd)}\n{done.stderr[-3000:]}")
            record.write_text(wanted)
    return folder


def overlay(name: str, packages: list[str]) -> Path:
    """The overlay `name` (test-artifacts/overlays/NAME) holding `packages`, without their dependencies."""
    return installed(OVERLAYS / name, packages)


def env_with(folder: Path) -> dict[str, str]:
    """This process's environment with `folder` first on PYTHONPATH, then this checkout (the ortlab under test)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
