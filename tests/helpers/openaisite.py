"""The `openai` client for the endpoint's test: installed into a folder of its own (test-artifacts/openai-site, once
per clone, from PyPI with its dependencies), never into ortlab's environment. The test's child process appends that
folder to the end of sys.path, so ortlab's own packages (pydantic, httpx, anyio) win and only what the client adds
(jiter, distro ...) comes from there. A lock file keeps two xdist workers to one install."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
OPENAI_VERSION = "3.57.0"
OPENAI_SITE = ROOT / "test-artifacts" / "openai-site"


def install_command() -> list[str]:
    uv = ROOT / ".venv" / "bin" / "uv"
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv") or "uv"
    return [uv_cmd, "pip", "install", "--target", str(OPENAI_SITE), f"openai=={OPENAI_VERSION}", "--python",
            sys.executable]  # fmt: skip


def openai_site() -> Path:
    """The folder holding openai, installed when missing; fails the test (with the command) when it cannot be."""
    OPENAI_SITE.parent.mkdir(parents=True, exist_ok=True)
    with open(OPENAI_SITE.parent / ".openai-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (OPENAI_SITE / "openai" / "__init__.py").is_file():
            cmd = install_command()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not (OPENAI_SITE / "openai" / "__init__.py").is_file():
                pytest.fail(
                    f"installing openai failed; run: {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
    return OPENAI_SITE
