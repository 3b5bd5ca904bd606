"""A free TCP port on loopback, for the processes ortlab starts (stdlib only: a bottom-layer utility).

Binding port 0 makes the OS pick a free port; the socket is closed before the port is handed on, so another
process could take it in between (every launcher that is handed a port has this race; torchrun picks its own the
same way). Always on 127.0.0.1. (A port picked here only tells a process where to listen; what it binds is its
own: torch's TCPStore binds every interface whatever it is given, so the stores of ortlab's process groups listen
on sockets ortlab binds itself, see `ortlab.runner.torchrun`.)

Loopback is not private on a shared machine: any local user can connect to a store. A TCPStore has no
authentication, but it has no command to list its keys either, so every key of an ortlab group lives under a
per-run secret prefix (`secret_store`): a user who connects can count keys and add junk, but cannot name, read or
overwrite the group's own. The secret travels only in environments (readable by the run's user alone) and Ray's
own calls, never on a command line. What is left is written in docs/guide/runs-and-the-run-folder.md.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta
from typing import Any

LOOPBACK = "127.0.0.1"
# The secret prefix of a run's process-group keys, inherited by torchrun's workers from the agent's environment.
GROUP_SECRET_ENV = "ORTLAB_GROUP_SECRET"

# Linux's name for the loopback interface: gloo binds its sockets to the address of the interface named here.
LOOPBACK_INTERFACE = "lo"


def free_port() -> int:
    """A port on loopback that was free a moment ago: a one-process group's MASTER_PORT, a server's port."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def bound_store(host: str, world_size: int, timeout: timedelta) -> tuple[Any, int]:
    """A TCPStore server listening on `host` only (an IP address), on a port picked at bind time. Returns (store,
    port). The rendezvous store of a run on this machine
    (`ortlab.runner.torchrun`) and of a Ray Train group (`ortlab.job.raygroup`); torch is imported here only."""
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # The store owns the socket from here (detach): were Python to close it while the store polls it, the store's
    # thread would abort the process. It returns at once (wait_for_workers): the others connect once it exists.
    store = TCPStore(
        host,
        port,
        world_size,
        True,
        timeout,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.detach(),
        use_libuv=False,
    )
    return store, port


def group_secret() -> str:
    """This process's group secret ($ORTLAB_GROUP_SECRET), made and set in the environment (which children inherit)
    when there is none yet: 128 random bits, which no one who can only connect to the store can guess."""
    return os.environ.setdefault(GROUP_SECRET_ENV, secrets.token_hex(16))


def secret_store(store: Any, secret: str) -> Any:
    """`store` seen through the prefix `secret`: every key the group reads or writes is `SECRET/...`."""
    from torch.distributed import PrefixStore

    return PrefixStore(f"ortlab-{secret}", store)
