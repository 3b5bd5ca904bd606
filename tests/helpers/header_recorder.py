"""A tiny HTTP server on a loopback address that records every request's path and headers.

Stands in for "a server a planted run folder names" (`target.cluster: http://elsewhere:8265`): a test points a run
at it and then asserts what reached it (no request at all, or no `Authorization` header). It answers 200 with `{}`
to everything, so a client that does reach it goes on as far as it can.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def recording_server(host: str = "127.0.0.2") -> Iterator[tuple[str, list[dict]]]:
    """Yield (base URL, requests): each request a dict with method, path and headers (a plain dict)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items())})
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
