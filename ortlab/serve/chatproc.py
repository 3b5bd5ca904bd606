"""A chat server in a child process, and a streaming client for it: how the notebook's playground talks to a model
without loading it into the kernel.

Why a child process: a model answering takes seconds of CPU per reply; in the kernel it would hold the GIL between
tokens and, worse, tie the kernel to the torch the model needs (ORT's runtime is torch 2.6, ortlab's compile runtime
a current torch). The child is `python -m ortlab.serve` (any interpreter: `python=`), on 127.0.0.1, with a fresh
token passed in its environment (never on its command line, which other users can read); it ends with its parent.

The client is the standard library's `http.client` reading server-sent events line by line; `Reply.cancel()` shuts
the socket, which ends the read at once and tells the server (a hang-up) to stop before its next token.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.serve.listener import TOKEN_ENV

START_TIMEOUT_S = 300.0  # the embedded SmolLM2's first use converts it from GGUF (20-40 s, more on a busy machine)


class ChatServerError(OrtlabError, RuntimeError):
    """The chat server did not start, or a request failed; the message carries the server's own words."""


class ChatServer:
    """`python -m ortlab.serve` for one model of a run (`base=True`: the model it started from; `onnx`: its ONNX
    export with a KV cache, in that folder)."""

    def __init__(
        self,
        run_path: str | os.PathLike,
        base: bool = False,
        python: str | None = None,
        onnx: str | os.PathLike | None = None,
    ):
        self.run_path, self.base = Path(run_path).resolve(), base
        self.onnx = None if onnx is None else Path(onnx).resolve()
        self.python = python or sys.executable
        self.token = secrets.token_urlsafe(32)
        self.info: dict[str, Any] = {}
        self.process: subprocess.Popen | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)

    @property
    def model_id(self) -> str:
        return str(self.info.get("id", ""))

    @property
    def port(self) -> int:
        return int(self.info["port"])

    def start(self, timeout: float = START_TIMEOUT_S) -> ChatServer:
        """Start the child and wait until it listens (its model loaded). Blocks: call it from a thread in a UI."""
        cmd = [self.python, "-m", "ortlab.serve", str(self.run_path), "--port", "0", "--parent", str(os.getpid())]
        if self.base:
            cmd.append("--base")
        if self.onnx is not None:
            cmd += ["--onnx", str(self.onnx)]
        env = {**os.environ, TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        lines: collections.deque[str] = collections.deque()
        reader = threading.Thread(target=self._read_announcement, args=(lines,), daemon=True)
        reader.start()
        reader.join(timeout)
        if not self.info:
            self.close()
            said = "\n".join(self._stderr) or "\n".join(lines) or "(nothing)"
            raise ChatServerError(f"the chat server for {self.run_path.name} did not start; it said:\n{said[-2000:]}")
        return self

    def _read_announcement(self, lines: collections.deque[str]) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                found = json.loads(line).get("ortlab_serve")
            except (json.JSONDecodeError, AttributeError):
                lines.append(line.rstrip())
                continue
            if isinstance(found, dict) and found.get("host") == "127.0.0.1":
                self.info = found
                break
        threading.Thread(target=self._drain, args=(self.process.stdout,), daemon=True).start()

    def _drain_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line.rstrip())

    @staticmethod
    def _drain(stream: Any) -> None:
        for _ in stream:
            pass

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def chat(self, messages: list[dict[str, str]], **settings: Any) -> Reply:
        """Ask for a streamed reply (settings: temperature, top_p, max_tokens, seed); iterate it for text."""
        if not self.info or not self.alive():
            raise ChatServerError(f"the chat server for {self.run_path.name} is not running")
        return Reply(self.port, self.token, {"model": self.model_id, "messages": messages, "stream": True, **settings})

    def close(self) -> None:
        """End the child (SIGTERM, then SIGKILL after 10 s)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class Reply:
    """One streamed chat completion. Iterate for text pieces; `cancel()` from any thread ends it; afterwards
    `finish_reason` is the server's ("stop", "length") or "cancelled"."""

    def __init__(self, port: int, token: str, body: dict[str, Any]):
        self.finish_reason: str | None = None
        self._cancelled = threading.Event()
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self._conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        self._response = self._conn.getresponse()
        if self._response.status != 200:
            text = self._response.read(4096).decode("utf-8", "replace")
            self._conn.close()
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                text = json.loads(text)["error"]["message"]
            raise ChatServerError(f"the chat server answered {self._response.status}: {text}")

    def __iter__(self) -> Iterator[str]:
        try:
            while not self._cancelled.is_set():
                try:
                    line = self._response.readline()
                except (OSError, ValueError, http.client.HTTPException):
                    break
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    return
                choice = json.loads(data)["choices"][0]
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
                if piece := choice.get("delta", {}).get("content"):
                    yield piece
        finally:
            if self._cancelled.is_set():
                self.finish_reason = "cancelled"
            self._conn.close()

    def cancel(self) -> None:
        """Stop reading and hang up: the server stops generating before its next token."""
        self._cancelled.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def wait_gone(process: subprocess.Popen | None, timeout: float = 10.0) -> bool:
    """Whether `process` has ended within `timeout` s (for tests and tidy-ups)."""
    deadline = time.monotonic() + timeout
    while process is not None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return process is None or process.poll() is not None


def save_chat(run_path: str | os.PathLike, session: str, record: dict[str, Any]) -> Path:
    """Append one exchange to `<run>/chats/<session>.jsonl` (created without following links inside the run folder:
    a planted `chats` link cannot make ortlab write elsewhere). Returns the file's path."""
    from ortlab import safeio

    rel = f"chats/{session}.jsonl"
    fd = safeio.open_in(run_path, rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return Path(run_path) / rel
