"""A free TCP port on loopback, for the processes ortlab starts (stdlib only: a bottom-layer utility).

Binding port 0 makes the OS pick a free port; the socket is closed before the port is handed on, so another
process could take it in between (every launcher that is handed a port has this race; torchrun picks its own the
same way). Always on 127.0.0.1. (A port picked here only tells a process where to listen; what it binds is its
own: torch's TCPStore binds every interface whatever it is given, so the stores of ortlab's process groups listen
on sockets ortlab binds itself, see `ortlab.runner.torchrun`.)
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
# Linux's name for the loopback interface: gloo binds its sockets to the address of the interface named here.
LOOPBACK_INTERFACE = "lo"


def free_port() -> int:
    """A port on loopback that was free a moment ago: a one-process group's MASTER_PORT, a server's port."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
