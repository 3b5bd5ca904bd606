"""The `openai` client for the endpoint's test: installed into a folder of its own (test-artifacts/openai-site, once
per clone, from PyPI with its dependencies), never into ortlab's environment. The test's child process appends that
folder to the end of sys.path, so ortlab's own packages (pydantic, httpx, anyio) win and only what the client adds
(jiter, distro ...) comes from there. Installed by `overlays.installed`, as trl-site is."""

from __future__ import annotations

from pathlib import Path

from overlays import installed

ROOT = Path(__file__).resolve().parent.parent.parent
OPENAI_VERSION = "3.57.0"
OPENAI_SITE = ROOT / "test-artifacts" / "openai-site"


def openai_site() -> Path:
    """The folder holding openai, installed when missing; fails the test (with the command) when it cannot be."""
    return installed(OPENAI_SITE, [f"openai=={OPENAI_VERSION}"], no_deps=False)
