"""`ortlab bundle`: an offline wheelhouse for installing ortlab into an environment that already has torch.

A GPU node typically has Python 3.12, its own CUDA build of torch, transformers, numpy, pandas and pyarrow, and
often no network. Installing ortlab there must not replace that torch (ortlab accepts torch >= 2.6), and must not
need the index. So the bundle holds what such an environment lacks and nothing else:

1. the ortlab wheel (built from this source tree, or downloaded when ortlab was installed from a wheel);
2. the resolution of `ortlab[ui]` together with the packages the environment provides (`uv pip compile` for the
   target Python, constrained by ortlab's lock where there is one), keeping what ortlab's side needs (followed
   through the resolver's "via" annotations) and leaving out the provided packages and what only they need;
3. binary wheels only, for the target interpreter (`pip download --only-binary :all: --python-version X`), so
   the machine that installs needs no compiler; and `manifest.json` with each file's size and sha256.

Then, on the offline machine: `pip install --no-index --find-links DIR 'ortlab[ui]'`. The ORT runtime
(onnxruntime-training, CPython <= 3.11, torch 2.6) is deliberately not in the bundle: it cannot install next to
a current torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab._version import __version__
from ortlab.envvars import SAFE_PATH, child_cwd
from ortlab.errors import OrtlabError
from ortlab.runtimes import _constraints, _find_links, _source_root, _uv

PROVIDED = ("torch", "transformers", "numpy", "pandas", "pyarrow")
EXTRAS = ("ui",)
MANIFEST = "manifest.json"
GOAL_MB = 60


class BundleError(OrtlabError, RuntimeError):
    """The wheelhouse could not be built; the message says which step failed and what to do."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bundle(
    out: str | Path,
    python_version: str | None = None,
    provided: tuple[str, ...] = PROVIDED,
    say: Callable[[str], None] = print,
    refresh: bool = False,
) -> dict[str, Any]:
    """Collect the wheelhouse into `out` for Python `python_version` ("3.12"; default: this interpreter's).

    The resolution is tried from uv's cache first (half a second instead of ~15 s of index round trips; the lock
    pins most versions anyway) and asks the index when the cache lacks something, or always with `refresh`.
    Returns the manifest (also written to `out/manifest.json`).
    """
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    target = python_version or here
    if not re.fullmatch(r"3\.\d{1,2}", target):
        raise BundleError(f"--python {target!r}: give a CPython minor version such as 3.12")
    for name in provided:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise BundleError(f"provided package {name!r} is not a package name")
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise BundleError(f"--out {out} is a file: give a folder (created if missing)")
    out.mkdir(parents=True, exist_ok=True)

    uv = _uv()
    if uv is None:
        raise BundleError("ortlab bundle resolves with uv, which is not installed here: pip install uv")
    links = [x for f in _find_links() for x in ("--find-links", f)]

    say(f"[1/3] the ortlab wheel -> {out}")
    wheel = _ortlab_wheel(uv, out)
    say(f"[2/3] resolving ortlab[{','.join(EXTRAS)}] for Python {target} next to {', '.join(provided)}")
    pins = _resolve(uv, wheel, target, provided, links, refresh)
    say(f"      {len(pins)} packages to bundle: {' '.join(pins)}")
    say(f"[3/3] downloading binary wheels for CPython {target}")
    _download(pins, out, target)
    return _manifest(out, target, provided, wheel, say)


def _ortlab_wheel(uv: str, out: Path) -> Path:

    for old in out.glob("ortlab-*.whl"):
        old.unlink()  # one ortlab wheel: the one that matches this ortlab
    root = _source_root()
    if root is not None:
        cmd = [uv, "build", "--wheel", "--out-dir", str(out), str(root)]
    else:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(out), f"ortlab=={__version__}"]
    _run(cmd, "building the ortlab wheel")
    wheels = sorted(out.glob("ortlab-*.whl"))
    if not wheels:
        raise BundleError(f"no ortlab wheel appeared in {out}")
    gitignore = out / ".gitignore"  # uv build drops one; it is not part of a wheelhouse
    if gitignore.is_file() and gitignore.read_text().strip() in ("", "*"):
        gitignore.unlink()
    return wheels[-1]


def _resolve(
    uv: str, wheel: Path, target: str, provided: tuple[str, ...], links: list[str], refresh: bool
) -> list[str]:
    """`name==version` of every package the target needs beyond `provided` and their own dependencies."""

    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.in"
        reqs.write_text("\n".join([*provided, f"{wheel.as_posix()}[{','.join(EXTRAS)}]"]) + "\n")
        # The lock's versions (the tested ones) where it pins a package; torch is the environment's, never pinned.
        cons = Path(tmp) / "constraints.txt"
        cons.write_text("\n".join(c for c in _constraints() if _norm(re.split(r"[=<>!~ ;]", c)[0]) != "torch") + "\n")
        cmd = [uv, "pip", "compile", str(reqs), "-c", str(cons), "--python-version", target]
        cmd += ["--python-platform", "x86_64-manylinux_2_28", "--no-header", "--annotation-style", "line", *links]
        text = None
        if not refresh:
            try:
                text = _run([*cmd, "--offline"], "resolving from uv's cache")
            except BundleError:
                text = None  # the cache lacks something: ask the index
        if text is None:
            text = _run(cmd, f"resolving for Python {target} (uv pip compile)")
    return _beyond(text, provided)


def _beyond(compiled: str, provided: tuple[str, ...]) -> list[str]:
    """From `uv pip compile --annotation-style line` output: the pins ortlab's side needs, i.e. every package
    reachable from ortlab through packages the environment does not provide.

    A line reads `name==version  # via a, b` (who requires it). A package that a provided package needs too still
    goes in when ortlab's side needs it: the environment's own versions of the provided packages need not pull it
    in (a GPU image's transformers 5.17 came with typer but no pydantic, which ortlab needs), and pip installs a
    bundled package only where the environment lacks it or has a version ortlab cannot use. What only the provided
    packages need (torch's sympy, transformers' tokenizers) stays out: the environment has those.
    """
    pins: dict[str, str] = {}
    needed_by: dict[str, set[str]] = {}
    for line in compiled.splitlines():
        spec, _, via = line.partition("#")
        spec = spec.strip()
        if "==" not in spec:
            continue
        name = _norm(spec.split("==")[0])
        pins[name] = spec
        parents = via.strip().removeprefix("via").split(",") if via.strip().startswith("via") else []
        needed_by[name] = {_norm(p.strip()) for p in parents if p.strip() and not p.strip().startswith("-r")}
    skip = {_norm(p) for p in provided}
    ours = {"ortlab"}
    grew = True
    while grew:
        more = {n for n, parents in needed_by.items() if n not in ours and n not in skip and parents & ours}
        grew = bool(more)
        ours |= more
    return [spec for name, spec in pins.items() if name in ours and name != "ortlab"]


def _download(pins: list[str], out: Path, target: str) -> None:
    """Binary wheels for the target interpreter, whatever this one is (the target flags are given always, so a
    bundle for this Python is built exactly as one for another)."""
    tag = target.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "-d", str(out)]
    cmd += ["--only-binary", ":all:", "--python-version", target, "--implementation", "cp"]
    cmd += ["--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none"]
    for platform in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"):
        cmd += ["--platform", platform]
    _run([*cmd, *pins], f"downloading wheels for CPython {target} (pip download)")


def _manifest(out: Path, target: str, provided: tuple[str, ...], wheel: Path, say: Callable[[str], None]) -> dict:
    files = []
    for path in sorted(out.glob("*.whl")):
        data = path.read_bytes()
        files.append({"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    total = sum(f["bytes"] for f in files)
    manifest = {
        "python": target,
        "platform": "linux x86_64 (manylinux_2_28 or older)",
        "provided_by_the_environment": list(provided),
        "ortlab_wheel": wheel.name,
        "install": f"pip install --no-index --find-links {out.name} 'ortlab[{','.join(EXTRAS)}]'",
        "files": files,
        "total_bytes": total,
        "total_mb": round(total / 2**20, 1),
        "goal_mb": GOAL_MB,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(
        f"wheelhouse: {len(files)} wheels, {manifest['total_mb']} MB (goal < {GOAL_MB} MB) in {out}\n"
        f"install offline with: {manifest['install']}"
    )
    return manifest


def _run(cmd: list[str], step: str) -> str:
    # ortlab's own folder and a safe path: `python -m pip` imports nothing from the caller's folder (every path in
    # `cmd` is absolute: `out` is resolved, the rest are temporary files and the source tree).
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env={**os.environ, **SAFE_PATH}, cwd=child_cwd()
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BundleError(f"{step} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout
