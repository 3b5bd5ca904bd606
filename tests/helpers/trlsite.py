"""trl for the tests that compare ortlab with TRL: installed into a folder of its own (test-artifacts/trl-site, once
per clone, from PyPI with `--no-deps`: ortlab's environment already holds what trl 1.16 needs), never into ortlab's
environment. The tests put that folder on a child's PYTHONPATH or, for the one module that needs it in-process, on
sys.path. It is installed by `overlays.installed` (a lock file keeps two xdist workers to one install)."""

from __future__ import annotations

from pathlib import Path

from overlays import installed

ROOT = Path(__file__).resolve().parent.parent.parent
TRL_VERSION = "1.16.0"
TRL_SITE = ROOT / "test-artifacts" / "trl-site"


def trl_site() -> Path:
    """The folder holding trl, installed when missing; fails the test (with the command) when it cannot be."""
    return installed(TRL_SITE, [f"trl=={TRL_VERSION}"])
