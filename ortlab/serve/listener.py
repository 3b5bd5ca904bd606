"""The listening half of `ortlab serve`: a socket on 127.0.0.1 (never another address), uvicorn serving the
endpoint on it, and the announcement of where it is and which token opens it.

The socket is bound and listening before anything is announced, so a client that reads the announcement can connect
at once (the kernel queues it until uvicorn accepts). Port 0 takes a free port; the announcement says which.
A server started for a notebook's playground is given its parent's pid and ends when that process is gone, so a
killed kernel leaves no model loaded behind.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HOST = "127.0.0.1"
TOKEN_ENV = "ORTLAB_SERVE_TOKEN"


def token_from_env() -> tuple[str, bool]:
    """(the token, whether it came from $ORTLAB_SERVE_TOKEN); a fresh random one otherwise."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    return (given, True) if given else (secrets.token_urlsafe(32), False)


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as e:
        sock.close()
        from ortlab.serve.engine import EngineError

        raise EngineError(
            f"cannot listen on {HOST}:{port} ({e.strerror}); pick another --port, or 0 for any free one"
        ) from None
    sock.listen(64)
    return sock


def serve(engine: Any, token: str, port: int, announce: Callable[[dict[str, Any]], None], parent: int | None = None):
    """Serve `engine` on 127.0.0.1:`port` until interrupted (SIGINT/SIGTERM) or `parent` exits."""
    import uvicorn

    from ortlab.serve.endpoint import build_app

    sock = bind(port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(build_app(engine, token), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    if parent:
        threading.Thread(target=_end_with, args=(parent, server), daemon=True).start()
    announce({"url": f"http://{HOST}:{bound}/v1", "host": HOST, "port": bound, **engine.describe()})
    server.run(sockets=[sock])


def _end_with(parent: int, server: Any) -> None:
    import psutil

    while psutil.pid_exists(parent) and os.getppid() == parent:
        time.sleep(1.0)
    server.should_exit = True


def announce_json(info: dict[str, Any]) -> None:
    """One JSON line on stdout: what the playground's `ChatServer` waits for."""
    sys.stdout.write(json.dumps({"ortlab_serve": info}) + "\n")
    sys.stdout.flush()
