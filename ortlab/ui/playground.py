"""`run.chat()`: a chat playground in the notebook: the run's model beside its base model (or beside another run), the
same prompt to both, the replies streamed side by side, with temperature, top-p, max new tokens and Stop.

The models never load into the kernel. Each side is a chat server in a child process (`ortlab.serve.chatproc`:
`python -m ortlab.serve` on 127.0.0.1 with a token of its own), and each reply is read on a thread of its own, which
updates that side's HTML as pieces arrive (at most every UPDATE_S, so a fast model does not flood the comm). The
kernel's thread only starts things: Send, Stop and the sliders return at once, and a cell runs while both answer.
The servers end with `close()`, with the kernel (they watch their parent), or when the playground is collected.

Every exchange is appended to `<run>/chats/<session>.jsonl` (prompt, reply, model, settings, finish reason). All
text shown (prompts, replies, model names, errors) is HTML-escaped: a model's output is data, never markup.
"""

from __future__ import annotations

import html
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from ortlab.runfolder.naming import run_folder
from ortlab.serve.chatproc import ChatServer, Reply, save_chat
from ortlab.serve.engine import MAX_NEW_TOKENS

UPDATE_S = 0.1
TURN_STYLE = "white-space:pre-wrap;margin:4px 0;padding:4px 6px;border-radius:4px;"


class Side:
    """One model of the playground: its server, its own conversation, the reply being read."""

    def __init__(self, label: str, server: ChatServer):
        self.label, self.server = label, server
        self.messages: list[dict[str, str]] = []
        self.ready = threading.Event()
        self.error = ""
        self.reply: Reply | None = None
        self.partial = ""
        self.finish_reason: str | None = None
        self.cancelled = threading.Event()
        self.thread: threading.Thread | None = None
        self.answering = False
        # Scrolls past 480 px; column-reverse keeps the view on the newest text while a reply streams (the browser
        # anchors such a box at its end), as a chat window does, and leaves it where it is once scrolled up to read.
        box = {"width": "50%", "max_height": "480px", "overflow": "auto", "border": "1px solid #ddd", "padding": "4px"}
        box |= {"display": "flex", "flex_flow": "column-reverse"}
        self.pane = widgets.HTML(layout=widgets.Layout(**box))
        self.pane.add_class("ortlab-chat-pane")

    def start(self) -> None:
        try:
            self.server.start()
        except Exception as e:  # shown in the pane: a playground never raises into a thread's void
            self.error = str(e)
        finally:
            self.ready.set()

    def render(self) -> None:
        name = self.server.model_id or self.label
        parts = [f"<div><b>{html.escape(self.label)}</b> <code>{html.escape(name)}</code></div>"]
        turns = list(self.messages)
        if self.answering:
            turns = [*turns, {"role": "assistant", "content": self.partial + " ▍"}]
        for turn in turns:
            color = "#eef" if turn["role"] == "user" else "#f6f6f6"
            parts.append(f'<div style="{TURN_STYLE}background:{color}">{html.escape(turn["content"])}</div>')
        if not self.ready.is_set():
            parts.append("<div><i>loading the model…</i></div>")
        if self.error:
            parts.append(f'<div style="color:#b00;white-space:pre-wrap">{html.escape(self.error)}</div>')
        self.pane.value = "".join(parts)


class Playground(widgets.VBox):
    """Two models answering the same prompts. `run`: a Run (or its folder); `other`: None (the run's base model),
    another Run, a run folder, or a run id in the same runs folder. `python`: the interpreter the servers run in
    (default: the kernel's; a runtime's Python works, so the models need not load with the kernel's torch).
    `onnx`: the folder of the run's ONNX export with a KV cache, answering on the left instead of the PyTorch model
    (hear what you ship; greedy, whatever the temperature says)."""

    def __init__(self, run: Any, other: Any = None, python: str | None = None, onnx: Any = None, **kwargs: Any):
        self.run_path = Path(getattr(run, "path", run))
        if other is None:
            right = Side("base model", ChatServer(self.run_path, base=True, python=python))
        else:
            other_path = Path(getattr(other, "path", other))
            if not other_path.is_dir() and "/" not in str(other) and os.sep not in str(other):
                other_path = run_folder(self.run_path.parent, str(other))
            right = Side(f"run {other_path.name}", ChatServer(other_path, python=python))
        left = Side(
            f"run {self.run_path.name}" + (" (ONNX)" if onnx else ""), ChatServer(self.run_path, False, python, onnx)
        )
        self.sides = [left, right]
        self.session = time.strftime("chat-%Y%m%d-%H%M%S")
        self.saved: Path | None = None
        self._lock = threading.Lock()
        self._active = 0  # sides still answering the last prompt

        self.prompt = widgets.Textarea(placeholder="Ask both models…", layout=widgets.Layout(width="100%"))
        self.send_button = widgets.Button(description="Send", button_style="primary")
        self.stop_button = widgets.Button(description="Stop", disabled=True)
        self.clear_button = widgets.Button(description="New chat")
        self.temperature = widgets.FloatSlider(value=0.7, min=0.0, max=2.0, step=0.05, description="temperature")
        self.top_p = widgets.FloatSlider(value=0.9, min=0.05, max=1.0, step=0.05, description="top-p")
        self.max_new_tokens = widgets.IntSlider(value=128, min=1, max=MAX_NEW_TOKENS, description="max tokens")
        self.note = widgets.HTML()
        for w, cls in ((self.send_button, "send"), (self.stop_button, "stop"), (self.prompt, "prompt")):
            w.add_class(f"ortlab-chat-{cls}")
        self.send_button.on_click(lambda _b: self.send())
        self.stop_button.on_click(lambda _b: self.stop())
        self.clear_button.on_click(lambda _b: self.clear())
        super().__init__(
            [
                widgets.HBox([side.pane for side in self.sides]),
                self.prompt,
                widgets.HBox([self.send_button, self.stop_button, self.clear_button, self.note]),
                widgets.HBox([self.temperature, self.top_p, self.max_new_tokens]),
            ],
            **kwargs,
        )
        self.add_class("ortlab-playground")
        for side in self.sides:
            side.render()
            threading.Thread(target=self._start, args=(side,), daemon=True).start()
        # The children end with the playground (collected, or closed), and with the kernel in any case (--parent).
        self._finalizer = weakref.finalize(self, _close_servers, [side.server for side in self.sides])

    def _start(self, side: Side) -> None:
        side.start()
        side.render()

    # --- actions (each returns at once: the work is on threads) ------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._active > 0

    def settings(self) -> dict[str, Any]:
        return {
            "temperature": float(self.temperature.value),
            "top_p": float(self.top_p.value),
            "max_tokens": int(self.max_new_tokens.value),
        }

    def send(self, prompt: str | None = None) -> None:
        """Send the prompt box's text (or `prompt`) to both models."""
        text = self.prompt.value if prompt is None else prompt
        if not text.strip() or self.busy:
            return
        self.prompt.value = ""
        settings = self.settings()
        self.send_button.disabled, self.stop_button.disabled = True, False
        self._active = len(self.sides)
        for side in self.sides:
            side.answering = True
            side.messages.append({"role": "user", "content": text})
            side.partial, side.finish_reason, side.reply = "", None, None
            side.cancelled.clear()
            side.thread = threading.Thread(target=self._answer, args=(side, settings), daemon=True)
            side.thread.start()

    def stop(self) -> None:
        """End both replies now (what each has said so far stays in the conversation)."""
        for side in self.sides:
            side.cancelled.set()
            if side.reply is not None:
                side.reply.cancel()

    def clear(self) -> None:
        """Start a new conversation (the saved one stays in its file)."""
        self.stop()
        for side in self.sides:
            if side.thread is not None:
                side.thread.join(5)
            side.messages, side.partial = [], ""
            side.render()
        self.session = time.strftime("chat-%Y%m%d-%H%M%S")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until both replies are done (for scripts and tests; a notebook never needs it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for side in self.sides:
            if side.thread is not None:
                side.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.busy

    def close(self) -> None:
        """Stop, end both servers and close the widgets."""
        self.stop()
        self._finalizer()
        super().close()

    # --- one side's reply, on its thread -----------------------------------------------------------------------

    def _answer(self, side: Side, settings: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            side.render()
            side.ready.wait()
            if side.error:
                return
            if not side.cancelled.is_set():
                side.reply = side.server.chat(side.messages, **settings)
                if side.cancelled.is_set():  # Stop came while the request was being made
                    side.reply.cancel()
                shown = 0.0
                for piece in side.reply:
                    side.partial += piece
                    if time.monotonic() - shown >= UPDATE_S:
                        side.render()
                        shown = time.monotonic()
            side.finish_reason = "cancelled" if side.cancelled.is_set() else (side.reply and side.reply.finish_reason)
        except Exception as e:
            side.error = f"{type(e).__name__}: {e}"
        finally:
            side.messages.append({"role": "assistant", "content": side.partial})
            side.partial, side.answering = "", False
            self._save(side, settings, time.monotonic() - started)
            side.render()
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.send_button.disabled, self.stop_button.disabled = False, True

    def _save(self, side: Side, settings: dict[str, Any], seconds: float) -> None:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "side": self.sides.index(side),
            "label": side.label,
            "model": side.server.model_id,
            "prompt": side.messages[-2]["content"] if len(side.messages) > 1 else "",
            "reply": side.messages[-1]["content"],
            "finish_reason": side.finish_reason,
            "error": side.error or None,
            "settings": settings,
            "seconds": round(seconds, 3),
        }
        try:
            self.saved = save_chat(self.run_path, self.session, record)
            self.note.value = f"saved to <code>{html.escape(str(self.saved))}</code>"
        except OSError as e:
            self.note.value = f'<span style="color:#b00">not saved: {html.escape(str(e))}</span>'


def _close_servers(servers: list[ChatServer]) -> None:
    for server in servers:
        server.close()
