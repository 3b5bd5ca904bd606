"""tcmalloc: Google's thread-caching malloc in place of glibc's, for the processes that train.

A training step allocates and frees thousands of short-lived tensors (activations, gradients, the optimizer's
temporaries); on a CPU, where torch allocates through malloc, glibc's allocator spends a measurable part of the step
on it and returns memory to the system only to ask for it again. tcmalloc keeps per-thread caches of freed blocks.
Measured on the development machine (2 cores, torch 2.6): the demo 1.07x with it, in 12 % less memory, the same
losses to every digit (`benchmarks/bench_allocator.py`); MiniLM at batch 16, length 128, ortlab's default mix
1.19x plain `transformers.Trainer` with it against 1.03x without (`bench_trainer.py`). Ray's jemalloc, measured
the same way, lost (0.71x): see docs/decisions/speed-and-precision.md.

An allocator is chosen when a process starts, by the dynamic loader: `LD_PRELOAD` names the library, and nothing
can swap it afterwards. So tcmalloc is not applied by the trainer but by whoever starts the training process
(`process_env`): the local launcher, torchrun's workers through it, the tuner's candidates, and `ortlab train`,
which starts itself again with it (`ortlab.cli.train`). A process that is already running (a Jupyter kernel
training in the foreground) cannot get it; there 'auto' means off, and says why. The trainer checks what really
happened: the library mapped into its own process (`loaded`).

Only the library's well-known system places are searched (`find`), never a path from a spec, a run folder or a
variable: `LD_PRELOAD` runs the library's code in every process ortlab starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from ortlab.accel import NOT_PROBED, Availability, package_version
from ortlab.envvars import child_cwd, child_env

LIBRARY = "libtcmalloc_minimal.so.4"  # the allocator alone: no heap profiler or checker, no libunwind needed
# Where distributions install it: Debian and Ubuntu (libtcmalloc-minimal4, one folder per architecture), Fedora
# and RHEL (gperftools-libs), Alpine and others (/usr/lib), and the Python environment's own lib (conda's
# gperftools package).
SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
REMEDY = (
    "install it: `apt-get install libtcmalloc-minimal4` (Debian, Ubuntu), `dnf install gperftools-libs` (Fedora, "
    "RHEL) or `conda install gperftools`; `scripts/dev setup` installs it where it can"
)
# tcmalloc prints "tcmalloc: large alloc N bytes" to stderr for every allocation over 1 GiB: a 135M-parameter
# model's state crosses that. It is not an error, and in the foreground it would land in the middle of the
# progress bar: only allocations over 1 TiB are reported.
QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**40)}
PROBE_TIMEOUT_S = 60.0


def find() -> Path | None:
    """The library's path on this machine, or None: only its well-known places (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        return None
    for folder in (*SEARCH_DIRS, os.path.join(sys.prefix, "lib")):
        path = Path(folder) / LIBRARY
        if path.is_file():
            return path
    return None


def loaded() -> Path | None:
    """The tcmalloc library mapped into this process (the loader's own record, /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if "/libtcmalloc" in path:
                    return Path(path)
    except OSError:
        return None
    return None


def process_env(env: dict[str, str], on: bool) -> dict[str, str]:
    """`env` for a training process with tcmalloc (`on`) or glibc's malloc: the library first in `LD_PRELOAD`, or
    every tcmalloc taken out of it (a process that has it must not hand it to a run that asked for glibc's). The
    user's other preloads are kept. `on` without the library installed changes nothing but the removal."""
    kept = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if "libtcmalloc" not in Path(p).name]
    path = find() if on else None
    out = dict(env)
    if path is not None:
        kept.insert(0, str(path))
        for k, v in QUIET.items():
            out.setdefault(k, v)
    if kept:
        out["LD_PRELOAD"] = " ".join(kept)
    else:
        out.pop("LD_PRELOAD", None)
    return out


def wanted(setting: bool | str) -> bool:
    """Whether a process ortlab starts on this machine for a run whose `accel.tcmalloc` is `setting` gets it."""
    return setting is True or (setting == "auto" and availability().available)


@lru_cache(maxsize=2)
def availability(probe: bool = False) -> Availability:
    """Whether training processes here can start with tcmalloc. With `probe=True` a Python process is started with
    it and imports torch and multiplies two matrices: the library loads, and torch lives with it."""
    name = "tcmalloc"
    if not sys.platform.startswith("linux"):
        return Availability(name, False, "tcmalloc is preloaded with LD_PRELOAD, which only Linux reads", "nothing")
    if package_version("torch") is None:
        return Availability(name, False, "torch is not installed", "pip install torch")
    path = find()
    if path is None:
        where = ", ".join((*SEARCH_DIRS, os.path.join(sys.prefix, "lib")))
        return Availability(name, False, f"{LIBRARY} is not installed (looked in {where})", REMEDY)
    if probe and (error := _probe(path)):
        return Availability(name, False, f"{path} is installed, but {error}", REMEDY, details={"path": str(path)})
    how = " (probed: torch ran with it)" if probe else NOT_PROBED
    return Availability(
        name,
        True,
        f"{LIBRARY}, preloaded in the processes ortlab starts to train{how}",
        "nothing to do ('auto' uses it; set accel.tcmalloc: false for glibc's malloc)",
        details={"path": str(path)},
    )


_PROBE = (
    "import torch; from ortlab.accel.tcmalloc import loaded; x = torch.randn(256, 256); (x @ x).sum().item(); "
    "print('TCMALLOC', loaded() is not None)"
)


def _probe(path: Path) -> str | None:
    """What went wrong starting a Python with `path` preloaded, or None when it loaded and torch ran."""
    env = process_env(child_env(), on=True)  # (this ortlab first on its path, as in every process ortlab starts)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            cwd=child_cwd(),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"a Python started with it did not finish: {e}"
    if out.returncode != 0:
        return f"a Python started with it failed: {(out.stderr.strip().splitlines() or ['no output'])[-1][:300]}"
    if "TCMALLOC True" not in out.stdout:
        return "the loader did not map it into a Python started with it (LD_PRELOAD ignored)"
    return None
