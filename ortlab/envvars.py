"""Environment variables: for a block of code (set and put back), and for the processes ortlab starts.

Libraries that ortlab drives (ONNX Runtime's ORTModule, the experiment trackers, a child process started inside the
block) read their switches from the environment rather than from arguments; the block sets them and restores every
variable exactly as it was, removing the ones that were unset.
"""

from __future__ import annotations

import os
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


def child_env() -> dict[str, str]:
    """The environment for a process ortlab starts on this machine (a run, a doctor, a Ray head): this one, without
    a torch.distributed group's variables, with this ortlab first on its path."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    # The run process imports this ortlab, whichever interpreter runs it (another runtime included).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ortlab_path(), env.get("PYTHONPATH")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Runs start on this machine: their gloo sockets are bound to the loopback interface (torchrun's rendezvous
    # store is on 127.0.0.1 too: `ortlab.runner.torchrun`).
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env
