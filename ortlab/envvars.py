"""Environment variables: for a block of code (set and put back), and for the processes ortlab starts.

Libraries that ortlab drives (ONNX Runtime's ORTModule, the experiment trackers, a child process started inside the
block) read their switches from the environment rather than from arguments; the block sets them and restores every
variable exactly as it was, removing the ones that were unset.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def temporary_env(values: dict[str, str]) -> Iterator[None]:
    """Set `values` in os.environ for the block; restore each variable (or its absence) afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The environment of a torch.distributed process group. A launched run must not inherit these from a kernel
# that trained in-process (ZeRO sets up a one-process group there): it would join the kernel's group.
DISTRIBUTED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


# A run whose Hub downloads go without the user's token (a folder from elsewhere, resumed: `ortlab.runner.trust`):
# huggingface_hub sends no implicit token (neither the variables' nor the saved one), and the variables are emptied.
WITHOUT_HUB_TOKEN = {"HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": ""}


def cache_dir() -> Path:
    """ortlab's cache (doctor reports, runtimes, tune results, the embedded assets, the local Ray head):
    $ORTLAB_CACHE_DIR, else $XDG_CACHE_HOME/ortlab, else ~/.cache/ortlab. One rule, read here only."""
    if os.environ.get("ORTLAB_CACHE_DIR"):
        return Path(os.environ["ORTLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ortlab"


def ortlab_path() -> str:
    """The folder holding this `ortlab` package: put first on a child's PYTHONPATH so that it runs this ortlab."""
    return str(Path(__file__).resolve().parent.parent)


# Python's switch (3.11+) that keeps the working folder (and a script's folder) off a new interpreter's import path.
# `python -m ortlab...` otherwise puts the folder it starts in first on sys.path, before ortlab and its packages.
SAFE_PATH = {"PYTHONSAFEPATH": "1"}


def child_env() -> dict[str, str]:
    """The environment for a process ortlab starts on this machine (a run, a doctor, a Ray head): this one, without
    a torch.distributed group's variables, with this ortlab first on its path and nothing of its working folder.

    PYTHONSAFEPATH: the child, and every Python it starts (torchrun's workers are `python -u -m ...`; Ray's
    processes; Inductor's compile workers), imports nothing from the folder it runs in. An empty entry of
    PYTHONPATH ('', as `PYTHONPATH=$PYTHONPATH:/x` leaves when it was unset) means the working folder too, whatever
    PYTHONSAFEPATH says: dropped. Interpreters older than 3.11 ignore the switch; `child_cwd` protects them."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    # The run process imports this ortlab, whichever interpreter runs it (another runtime included).
    user = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([ortlab_path(), *user])
    env.update(SAFE_PATH)
    # The child runs in another folder (`child_cwd`): a relative cache folder must keep naming this one.
    if env.get("ORTLAB_CACHE_DIR"):
        env["ORTLAB_CACHE_DIR"] = os.path.abspath(env["ORTLAB_CACHE_DIR"])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Runs start on this machine: their gloo sockets are bound to the loopback interface (torchrun's rendezvous
    # store is on 127.0.0.1 too: `ortlab.runner.torchrun`).
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def child_cwd() -> str:
    """The working folder of a Python ortlab starts for its own work (a run's worker, torchrun, a probe, a tune
    candidate, the local Ray head): `cwd` in ortlab's cache, this user's only, holding nothing of ours.

    Not the caller's folder: an interpreter older than 3.11 ignores PYTHONSAFEPATH, and `python -m` puts the folder
    it starts in first on its import path (a `typer.py` or `torch.py` where the user typed the command, or a
    notebook's folder, would be imported). Not the run folder either: a run folder may come from anyone, and a
    resumed one could hold a `torch.py`. A spec's relative paths are still read against the caller's folder, which
    the worker is given (`--base`, `ortlab.spec.RunSpec.anchored`). "/" when the folder cannot be made private."""
    path = cache_dir().resolve() / "cwd"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return "/"
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        return "/"
    return str(path)
