"""What a process tree listens on, read with psutil (not with ortlab's own helpers, which are under test)."""

from __future__ import annotations

import socket

LOOPBACK_IPS = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listening(pid: int) -> list[tuple[str, str, int]]:
    """(process name, ip, port) of every listening TCP socket and unconnected UDP socket of `pid` and all of its
    descendants."""
    import psutil

    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                found.append((name, c.laddr.ip, c.laddr.port))
    return found


def beyond_loopback(found: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [f for f in found if f[1] not in LOOPBACK_IPS]
