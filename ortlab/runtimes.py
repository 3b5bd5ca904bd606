"""Second Python runtimes that ortlab builds and launches runs in: today `compile`, torch >= 2.7 without ORT.

Why a second runtime at all: onnxruntime-training 1.19.2 (the last release) only works with torch <= 2.6, and
transformers 5 only compiles with torch >= 2.7 (it calls `torch.compiler.is_exporting`). One environment cannot
hold both, so ortlab keeps the ORT runtime (the one it is installed in) and builds a second one next to it:

    ortlab runtime create compile        # or ortlab.runtimes.create("compile")
    ortlab.runtimes.python_for("compile") # its interpreter, or None while it is missing or out of date

Where it lives: `$ORTLAB_RUNTIMES_DIR/<name>`, else `<ortlab's cache>/runtimes/<name>` (`~/.cache/ortlab/...`).
A runtime is derived data (rebuilt from the lock in well under a minute when the wheels are cached), so it
belongs with the cache, not with a project or the user's data; one per user, shared by every project.

What goes in: torch (the CPU wheel from pip's configured find-links folder when it holds one, else the package
index), transformers, datasets, accelerate and ortlab's other non-ORT dependencies at the versions of
`requirements/dev.lock` (the ORT runtime's own versions when there is no lock: an installed ortlab), the
offline assets, and ortlab itself from this source tree (editable). Never onnxruntime-training.

When it counts as built: a stamp file written last, holding a fingerprint of everything that decided its
contents. A build that failed or was interrupted has no stamp (or an old one), so `python_for` does not
accept it and the next `create` wipes it and starts again. Two `create` calls at once are serialised by a
lock file. Nothing here imports torch: `python_for` reads one small file and stats another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ortlab.envvars import SAFE_PATH, cache_dir, child_cwd
from ortlab.errors import OrtlabError

# The runtimes ortlab knows how to build, with what each is for (shown by the CLI).
RUNTIMES: dict[str, str] = {
    "compile": "torch >= 2.7 without ONNX Runtime, for torch.compile (Inductor)",
}
STAMP = ".ortlab-runtime.json"
BUILDING = ".ortlab-runtime-building"
# Bump when the recipe below changes in a way that needs existing runtimes rebuilt.
# 3: uv installs with --compile-bytecode (see `_install`)
RECIPE = 3  # 2: peft (LoRA runs) and the local trackers (trackio, tensorboard) joined PACKAGES
# torch for the compile runtime when no find-links folder offers a wheel: the version this project tested.
DEFAULT_TORCH = "2.13.0"
# Packages whose lock pins do not apply to the compile runtime: the ORT runtime's torch and what only that
# torch needs (its CUDA libraries, its triton, and sympy, which torch 2.6 pins to 1.13.1 while newer torch
# needs >= 1.13.3). Everything else in the lock constrains the compile runtime to the same versions.
NOT_CONSTRAINED = re.compile(r"^(torch|triton|sympy|onnxruntime(-training)?|nvidia-[a-z0-9-]+)$")
# ortlab's non-ORT dependencies (pyproject's `dependencies` and the deepspeed extra), plus the libraries the
# runs use directly. Their versions come from the lock (or from this environment, see `_constraints`).
PACKAGES = (
    "transformers",
    "tokenizers",
    "safetensors",
    "datasets",
    "accelerate",
    "huggingface_hub",
    "deepspeed",
    "numpy",
    "pydantic",
    "typer",
    "rich",
    "pyyaml",
    "packaging",
    "psutil",
    "peft",
    "trackio",
    "tensorboard",
)


class RuntimeCreateError(OrtlabError, RuntimeError):
    """Building a runtime failed; the message names the step, what it ran and what to do."""


def runtimes_dir() -> Path:
    """$ORTLAB_RUNTIMES_DIR, else ortlab's cache folder's `runtimes/` (see the module docstring for why)."""
    if os.environ.get("ORTLAB_RUNTIMES_DIR"):
        return Path(os.path.abspath(os.path.expanduser(os.environ["ORTLAB_RUNTIMES_DIR"])))
    # Absolute: the installers and the runs start in ortlab's own folder (`ortlab.envvars.child_cwd`).
    return Path(os.path.abspath(cache_dir())) / "runtimes"


def python_for(name: str) -> Path | None:
    """The interpreter of runtime `name` if it was built completely for this ortlab and lock, else None.

    Cheap (a file read and a stat, no subprocess, no torch): the spec check and the launcher call it on every
    run. A runtime built from an older lock is not returned: it would train with other library versions than
    the ORT runtime, which makes the two incomparable; `create` rebuilds it.
    """
    return state_of(name).python


@dataclass(frozen=True)
class _State:
    """What is on disk for one runtime: `python` only when it is ready; `why` says what is wrong otherwise."""

    name: str
    path: Path
    python: Path | None
    why: str
    stamp: dict | None = None


def state_of(name: str) -> _State:
    """What is on disk for the runtime `name`: ready (its interpreter), or why not and the command that fixes it."""
    _known(name)
    path = runtimes_dir() / name
    python = path / "bin" / "python"
    remedy = f"`ortlab runtime create {name}`"
    try:
        stamp = json.loads((path / STAMP).read_text())
    except FileNotFoundError:
        why = "was never built" if not path.exists() else "was not built completely (no stamp)"
        return _State(name, path, None, f"the {name} runtime {why}: {remedy} builds it")
    except (OSError, ValueError) as e:
        return _State(name, path, None, f"the {name} runtime's stamp is unreadable ({e}): {remedy} rebuilds it")
    if not isinstance(stamp, dict) or stamp.get("fingerprint") != _fingerprint(name):
        return _State(
            name,
            path,
            None,
            f"the {name} runtime was built for another ortlab or requirements/dev.lock: {remedy} rebuilds it",
            stamp if isinstance(stamp, dict) else None,
        )
    if not (python.is_file() and os.access(python, os.X_OK)):
        return _State(name, path, None, f"the {name} runtime has no interpreter at {python}: {remedy} rebuilds it")
    return _State(name, path, python, "ready", stamp)


def _known(name: str) -> None:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; ortlab builds: {', '.join(RUNTIMES)}")


# --- what goes in ------------------------------------------------------------------------------------------------


def _source_root() -> Path | None:
    """The source tree this ortlab runs from (a checkout with pyproject.toml), or None for an installed ortlab."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "ortlab").is_dir() else None


def _constraints() -> list[str]:
    """Pins for everything but torch: the lock's lines, or (no lock) this environment's versions."""
    root = _source_root()
    lock = root / "requirements" / "dev.lock" if root else None
    if lock is not None and lock.is_file():
        pins = []
        for line in lock.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" not in line or line.startswith("-"):
                continue
            name = re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-")
            if not NOT_CONSTRAINED.match(name):
                pins.append(line)
        return pins
    return [f"{p}=={v}" for p in PACKAGES if (v := _installed(p))]


def _installed(dist: str) -> str | None:
    """The installed version of a distribution (read here, not from `ortlab.accel`: the accelerations ask the
    runtimes where a run trains, and the runtimes need nothing of the accelerations)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _assets() -> list[str]:
    root = _source_root()
    assets = root / "requirements" / "assets.txt" if root else None
    if assets is None or not assets.is_file():
        return []
    return [s for line in assets.read_text().splitlines() if (s := line.split("#", 1)[0].strip())]


def _fingerprint(name: str) -> str:
    """Everything that decides what `create(name)` installs, except the torch wheel found on this machine (that
    would need pip's configuration, a subprocess; the stamp records which torch went in)."""
    h = hashlib.sha256()
    for part in (
        name,
        str(RECIPE),
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        str(_source_root()),
        os.environ.get("ORTLAB_RUNTIME_TORCH", ""),
        *_constraints(),
        *_assets(),
    ):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def _find_links() -> list[str]:
    """pip's configured find-links folders (pip.conf, PIP_FIND_LINKS), which uv does not read by itself."""
    found: list[str] = []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **SAFE_PATH},
            cwd=child_cwd(),
        ).stdout
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key.strip().endswith("find-links"):
                found += [v for v in value.strip().strip("'\"").split() if v]
    for value in os.environ.get("PIP_FIND_LINKS", "").split():
        found.append(value)
    # Named in full: the installers run in ortlab's own folder, not this one.
    return list(dict.fromkeys(os.path.abspath(f) for f in found if Path(f).is_dir()))


def _torch_requirement(find_links: list[str]) -> tuple[str, str]:
    """(requirement, where it comes from). A torch >= 2.7 wheel for this Python in a find-links folder wins:
    it is a local CPU build (seconds, ~200 MB) where PyPI's Linux torch is the CUDA build (several GB)."""
    if os.environ.get("ORTLAB_RUNTIME_TORCH"):
        value = os.environ["ORTLAB_RUNTIME_TORCH"]  # a requirement, or a wheel's path (named in full: see _run)
        return (os.path.abspath(value) if os.path.isfile(value) else value), "ORTLAB_RUNTIME_TORCH"
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    best: tuple[tuple[int, ...], str, str] | None = None
    for folder in find_links:
        for wheel in Path(folder).glob(f"torch-*-{tag}-{tag}-*.whl"):
            version = wheel.name.split("-")[1]
            numbers = tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])
            if numbers >= (2, 7) and (best is None or numbers > best[0]):
                best = (numbers, version, str(wheel))
    if best is not None:
        return f"torch=={best[1]}", f"the wheel {best[2]}"
    return (
        f"torch=={DEFAULT_TORCH}",
        "the package index (no torch >= 2.7 wheel for this Python in a find-links folder: on Linux this is the "
        "CUDA build, several GB)",
    )


# --- building ----------------------------------------------------------------------------------------------------


def create(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """Build runtime `name` (idempotent: returns at once when it is ready) and return its interpreter.

    Shows each step through `progress` (default: print), with the installers' own lines. Raises
    `RuntimeCreateError` naming the step that failed; a failed build is removed, so it never passes for a
    built one. Takes about a minute with the CPU torch wheel at hand (see docs/decisions/ort-and-runtimes.md for the
    figure).
    """
    _known(name)
    say = progress or (lambda line: print(line, flush=True))
    state = state_of(name)
    if state.python is not None:
        say(f"the {name} runtime is ready: {state.python}")
        return state.python
    root = runtimes_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RuntimeCreateError(f"step 'folder': cannot create {root}: {e} (set ORTLAB_RUNTIMES_DIR)") from None
    with _locked(root / f".{name}.lock", say):
        state = state_of(name)  # another process may have built it while we waited for the lock
        if state.python is not None:
            say(f"the {name} runtime is ready: {state.python}")
            return state.python
        started = time.monotonic()
        try:
            python = _build(state, say)
        except BaseException:
            # Nothing half-built stays behind (it has no stamp anyway; removing it keeps the folder honest).
            shutil.rmtree(state.path, ignore_errors=True)
            raise
        say(f"the {name} runtime is ready in {time.monotonic() - started:.0f} s: {python}")
        return python


@contextlib.contextmanager
def _locked(path: Path, say: Callable[[str], None]):
    import fcntl

    with path.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another process is building this runtime; waiting for it ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(state: _State, say: Callable[[str], None]) -> Path:
    path = state.path
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not ((path / "pyvenv.cfg").exists() or (path / BUILDING).exists()):
            raise RuntimeCreateError(
                f"step 'folder': {path} exists and is not an ortlab runtime; move it away or set ORTLAB_RUNTIMES_DIR"
            )
        say(f"removing the old {state.name} runtime ({state.why})")
        (path / STAMP).unlink(missing_ok=True)  # first: from here on it is not a runtime any more
        shutil.rmtree(path)
    uv = _uv()
    base = _base_python()
    steps = 5
    say(f"[1/{steps}] creating the virtual environment {path} (Python {sys.version.split()[0]}, {base})")
    path.mkdir(parents=True)
    (path / BUILDING).write_text(str(os.getpid()))
    if uv:
        _run([uv, "venv", "--quiet", "--python", base, "--allow-existing", path], "virtual environment", say)
    else:
        _run([base, "-m", "venv", path], "virtual environment", say)
    python = path / "bin" / "python"
    find_links = _find_links()
    torch_req, torch_from = _torch_requirement(find_links)
    say(f"[2/{steps}] installing {torch_req} (from {torch_from}) and the libraries at the lock's versions")
    constraints = path / ".constraints.txt"
    constraints.write_text("\n".join(_constraints()) + "\n")
    requirements = [torch_req, *(f"{p}" for p in PACKAGES)]
    _install(uv, python, ["-c", constraints, *requirements], find_links, "packages", say)
    assets = _assets()
    if assets:
        say(f"[3/{steps}] installing the offline models and data ({', '.join(assets)})")
        _install(uv, python, ["--no-deps", *assets], find_links, "assets", say)
    else:
        say(f"[3/{steps}] no offline assets to install (not a source tree)")
    root = _source_root()
    if root is not None:
        say(f"[4/{steps}] installing ortlab from {root} (editable, without its dependencies)")
        _install(uv, python, ["--no-deps", "-e", root], find_links, "ortlab", say)
    else:
        from ortlab._version import __version__

        say(f"[4/{steps}] installing ortlab {__version__} (without its dependencies)")
        _install(uv, python, ["--no-deps", f"ortlab=={__version__}"], find_links, "ortlab", say)
    say(f"[5/{steps}] checking the runtime (imports torch, transformers and ortlab there)")
    facts = _check(python, say)
    stamp = {
        "name": state.name,
        "fingerprint": _fingerprint(state.name),
        "created": time.time(),
        "torch_requirement": torch_req,
        "torch_from": torch_from,
        "installer": "uv" if uv else "pip",
        **facts,
    }
    (path / BUILDING).unlink()
    tmp = path / f".{STAMP}.tmp"
    tmp.write_text(json.dumps(stamp, indent=2))
    os.replace(tmp, path / STAMP)  # last: only now does the runtime count as built
    return python


def _uv() -> str | None:
    """uv next to this interpreter (the dev environment has it), else on PATH; None means pip."""
    here = Path(sys.executable).parent / "uv"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("uv")


def _base_python() -> str:
    """The interpreter this venv was made from: the new runtime gets the same Python version (the CPU torch
    wheel and the lock are for it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if Path(base).exists() else sys.executable


def _install(
    uv: str | None,
    python: Path,
    args: list,
    find_links: list[str],
    step: str,
    say: Callable[[str], None],
) -> None:
    links = [x for f in find_links for x in ("--find-links", f)]
    if uv:
        # Bytecode written at install, as pip does by default and uv does not: where PYTHONDONTWRITEBYTECODE is set (as
        # on these machines) every process would otherwise compile torch and transformers from source on each
        # import (7.6-12.4 s against 3.5-3.9 s for `import torch, transformers, datasets`, issue #42).
        cmd = [uv, "pip", "install", "--compile-bytecode", "--python", python, *links, *args]
    else:
        cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", *links, *args]
    _run(cmd, step, say, env={"VIRTUAL_ENV": str(python.parent.parent)})


def _run(cmd: list, step: str, say: Callable[[str], None], env: dict[str, str] | None = None) -> None:
    """Run one installer command, passing its lines to `say` (that is the progress) and keeping the last ones
    for the error."""
    cmd = [str(c) for c in cmd]
    say("  $ " + " ".join(cmd))
    tail: list[str] = []
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**_clean_env(), **(env or {})},
            cwd=child_cwd(),  # `python -m pip` / `-m venv` import nothing from the caller's folder
        )
    except OSError as e:
        raise RuntimeCreateError(f"step '{step}' could not start `{cmd[0]}`: {e}") from None
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            say("    " + line)
            tail = [*tail[-14:], line]
    code = proc.wait()
    if code != 0:
        shown = "\n".join(f"    {t}" for t in tail)
        raise RuntimeCreateError(
            f"step '{step}' failed: `{' '.join(cmd)}` exited with {code}; its last lines:\n{shown}\n"
            "Nothing was kept; fix the cause (network, disk space, the package index) and run it again"
        )


def _clean_env() -> dict[str, str]:
    """This environment without the variables that would point the installers or Python at the ORT runtime."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **SAFE_PATH}


def _check(python: Path, say: Callable[[str], None]) -> dict:
    """Import what a run imports, in the new runtime, and read its versions. Failing here fails the build."""
    code = (
        "import json, sys, torch, transformers, ortlab\n"
        "ok = hasattr(torch.compiler, 'is_exporting')\n"
        "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
        "'transformers': transformers.__version__, 'ortlab': ortlab.__version__, 'is_exporting': ok}))\n"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=300, env=_clean_env(), cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeCreateError(f"step 'check': the new interpreter could not run: {e}") from None
    if out.returncode != 0:
        last = "\n".join(out.stderr.strip().splitlines()[-8:])
        raise RuntimeCreateError(f"step 'check': importing torch, transformers and ortlab failed:\n{last}")
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    if not facts.pop("is_exporting"):
        raise RuntimeCreateError(
            f"step 'check': torch {facts['torch']} went in, but transformers 5 needs torch >= 2.7 to compile "
            "(torch.compiler.is_exporting is missing); set ORTLAB_RUNTIME_TORCH to a newer torch"
        )
    say(f"    torch {facts['torch']}, transformers {facts['transformers']}, ortlab {facts['ortlab']}")
    return facts
