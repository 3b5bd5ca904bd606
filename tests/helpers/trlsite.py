"""trl for the tests that compare ortlab with TRL: installed into a folder of its own (test-artifacts/trl-site, once
per clone, from PyPI with `--no-deps`: ortlab's environment already holds what trl 1.16 needs), never into ortlab's
environment. The tests put that folder on a child's PYTHONPATH or, for the one module that needs it in-process, on
sys.path. Two xdist workers may ask at once: a lock file keeps it to one install."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
TRL_VERSION = "1.16.0"
TRL_SITE = ROOT / "test-artifacts" / "trl-site"


def install_command() -> list[str]:
    uv = ROOT / ".venv" / "bin" / "uv"
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv") or "uv"
    return [uv_cmd, "pip", "install", "--target", str(TRL_SITE), f"trl=={TRL_VERSION}", "--no-deps", "--python",
            sys.executable]  # fmt: skip


def trl_site() -> Path:
    """The folder holding trl, installed when missing; fails the test (with the command) when it cannot be."""
    TRL_SITE.parent.mkdir(parents=True, exist_ok=True)
    with open(TRL_SITE.parent / ".trl-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (TRL_SITE / "trl" / "__init__.py").is_file():
            cmd = install_command()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not (TRL_SITE / "trl" / "__init__.py").is_file():
                pytest.fail(f"installing trl failed; run: {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return TRL_SITE
