"""The run directory: everything a run is, on disk, readable by any process at any time.

    spec.yaml          the RunSpec, as run
    status.json        pending | running | completed | failed | stopped, with pid, step, error and traceback
    metrics.jsonl      append-only metrics stream (one JSON object per line; see ortlab.train.metrics)
    logs/run.log       the run process's stdout and stderr
    checkpoints/       Trainer checkpoints (written on stop, and every hyper.save_steps)
    model/             the final model and tokenizer (only once completed)
    result.json        eval before/after, throughput summary, what applied (only once completed)
    control/stop       present = a graceful stop was asked for
    control/pause      present = the run waits after its current step until the file is removed

status.json and result.json are replaced atomically (and fsynced), so a reader never sees half of one, even
after a power cut. Status changes happen under a lock on the folder (`.status.lock`) and follow the state
machine in `TRANSITIONS`, so a reader's liveness check cannot overwrite a worker's `completed`, a launcher's
`pending` cannot overwrite `running`, and two `resume` calls cannot both start a worker. A run whose process
died without saying so (kill -9, out of memory, machine reboot), or never started, is recognised (dead pid, or
no pid long after launch) and marked failed the first time anyone reads its status: no run stays "running" or
"pending" forever.

Run names are folder names under the runs root: `check_name` allows a safe alphabet only, and `resolve` turns
an id from a user, the CLI or a server into a folder that is inside the root (no `..`, no absolute paths, no
symlink out of it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from ortlab.runner.stream import MetricsStream, summary_of
from ortlab.runner.stream import records as stream_records

STATES = ("pending", "running", "completed", "failed", "stopped")
TERMINAL = frozenset({"completed", "failed", "stopped"})
# Which state may follow which. `pending` after `stopped`/`failed` is a resume claiming the folder; a terminal
# state is final otherwise (a late liveness check or a launcher cannot rewrite history).
TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"pending"}),
    "pending": frozenset({"pending", "running", "completed", "failed", "stopped"}),
    "running": frozenset({"running", "completed", "failed", "stopped"}),
    "stopped": frozenset({"pending"}),
    "failed": frozenset({"pending"}),
    "completed": frozenset(),
}
# A run that was claimed but whose process never recorded itself is declared failed after this long.
START_GRACE_S = 120.0

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_RULE = "1-100 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
TASK_SHORT = {"sequence-classification": "cls", "token-classification": "tok", "causal-lm": "clm", "seq2seq": "s2s"}


class RunStateError(RuntimeError):
    """A status change the run's current state does not allow (the message says which and why)."""


def check_name(name: str, what: str = "run name") -> str:
    """`name` if it is a safe folder name, else ValueError saying what is allowed."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not allowed: use {NAME_RULE}")
    return name


def default_name(task: str, model: str, when: datetime | None = None) -> str:
    """Short and telling: `cls-all-minilm-l6-v2-1123-101500` (task, model, month-day, time)."""
    base = re.split(r"[\\/]", model.rstrip("/\\"))[-1] or "model"
    short = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._")[:28].strip("-._") or "model"
    stamp = (when or datetime.now()).strftime("%m%d-%H%M%S")
    return f"{TASK_SHORT.get(task, 'run')}-{short}-{stamp}"


def resolve(root: str | os.PathLike, run_id: str) -> Path:
    """The folder of run `run_id` under `root`, guaranteed inside it; ValueError for any id that could escape."""
    check_name(run_id, "run id")
    base = Path(root)
    path = base / run_id
    if path.is_symlink():
        raise ValueError(f"run id {run_id!r} is a symbolic link; ortlab only opens real run folders")
    if path.exists() and path.resolve().parent != base.resolve():
        raise ValueError(f"run id {run_id!r} resolves outside the runs folder {str(base)!r}")
    return path


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically and durably: readers never see half a file, and a crash leaves the old or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, default=str))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def process_alive(pid: int, create_time: float | None = None) -> bool:
    """Is `pid` a live (not zombie) process, and the same one that was recorded (not a reused pid)?"""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def process_create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def read_metrics(path: Path, offset: int = 0, max_bytes: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines from byte `offset` on, and the offset after the last line read.

    A line still being written (no newline yet), or cut short by a killed process, is not returned; a reader
    following the file picks it up on its next call once it is complete. `max_bytes` bounds one read (a server
    answering from offset 0 on a long run); the rest comes on the next call, from the offset returned. The reading
    itself (bounded lines, no links followed, damaged lines passed over) is `ortlab.runner.stream.MetricsStream`.
    """
    path = Path(path)
    stream = MetricsStream(path.parent, offset, name=path.name)
    return stream.read(max_bytes), stream.offset


def _checkpoint_complete(path: Path) -> bool:
    """Trainer writes a checkpoint's trainer_state.json last (and not atomically): a checkpoint is whole when
    that file exists and parses. One cut by a crash, a kill or a full disk is passed over."""
    try:
        return isinstance(json.loads((path / "trainer_state.json").read_text()), dict)
    except (OSError, ValueError):
        return False


class RunDir:
    """One run's folder. Cheap to create: it reads nothing until asked."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def id(self) -> str:
        return self.path.name

    spec_path = property(lambda self: self.path / "spec.yaml")
    status_path = property(lambda self: self.path / "status.json")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    result_path = property(lambda self: self.path / "result.json")
    log_path = property(lambda self: self.path / "logs" / "run.log")
    checkpoints = property(lambda self: self.path / "checkpoints")
    model_dir = property(lambda self: self.path / "model")
    stop_path = property(lambda self: self.path / "control" / "stop")

    @classmethod
    def create(cls, root: str | os.PathLike, spec: Any, name: str | None = None) -> RunDir:
        """A new, uniquely named run folder inside `root`, holding the spec and a `pending` status."""
        name = check_name(name or spec.name or default_name(spec.task, spec.model.name))
        base = Path(root)
        base.mkdir(parents=True, exist_ok=True)
        path, i = base / name, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                i += 1
                path = base / f"{name}-{i}"
        run = cls(path)
        (path / "logs").mkdir()
        (path / "control").mkdir()
        tmp = path / ".spec.yaml.tmp"
        tmp.write_text(spec.to_yaml())
        os.replace(tmp, run.spec_path)
        run.set_status("pending")  # last: only a folder with a status is a run (`runs()` lists no other)
        return run

    def spec(self) -> Any:
        from ortlab.spec import RunSpec

        return RunSpec.load(self.spec_path, stored=True)

    # --- status --------------------------------------------------------------------------------------------

    def read_status(self) -> dict[str, Any]:
        try:
            status = json.loads(self.status_path.read_text())
        except FileNotFoundError:
            return {"state": "missing"}
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            return {"state": "unknown"}
        if not isinstance(status, dict) or status.get("state") not in STATES:
            return {"state": "unknown"}
        if not isinstance(status.get("pid"), (int, type(None))) or isinstance(status.get("pid"), bool):
            status["pid"] = None  # a hand-edited pid is no pid: never signalled, never trusted
        return status

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's status lock (across processes; a lock file, released if the holder dies)."""
        with (self.path / ".status.lock").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def set_status(self, state: str, expect: frozenset[str] | set[str] | None = None, **fields: Any) -> dict[str, Any]:
        """Move the run to `state`, keeping its identity fields. Raises RunStateError when the current state
        does not allow it (see TRANSITIONS), or is not one of `expect` when given."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        with self.locked():
            return self._set_status_locked(state, expect, fields)

    def _set_status_locked(self, state: str, expect: Any, fields: dict[str, Any]) -> dict[str, Any]:
        current = self.read_status() if self.status_path.exists() else {}
        now_state = current.get("state")
        if now_state in ("missing", "unknown"):
            now_state = None if now_state == "missing" else "pending"
        allowed = TRANSITIONS.get(now_state, frozenset(STATES))
        if state not in allowed or (expect is not None and now_state not in expect):
            raise RunStateError(f"run {self.id} is {now_state}: it cannot become {state}")
        identity = ("pid", "create_time", "started", "launcher", "runtime", "python", "world_size", "worker_pid")
        keep = {k: v for k, v in current.items() if k in identity}
        status = {**keep, **fields, "state": state, "updated": time.time()}
        if state in TERMINAL:
            status.setdefault("ended", time.time())
        write_json(self.status_path, status)
        return status

    def update_status(self, **fields: Any) -> dict[str, Any]:
        """Add fields (a pid, a step) to the status without changing its state."""
        with self.locked():
            status = {**self.read_status(), **fields, "updated": time.time()}
            write_json(self.status_path, status)
            return status

    def status(self) -> dict[str, Any]:
        """The status, after checking that a pending/running run still has a live process (or, pending without
        one, that it was claimed only recently)."""
        status = self.read_status()
        if status.get("state") in ("pending", "running") and self._looks_dead(status):
            with self.locked():  # re-check under the lock: the worker may have ended properly meanwhile
                status = self.read_status()
                if status.get("state") in ("pending", "running") and self._looks_dead(status):
                    status = self._set_status_locked("failed", None, self._death_report(status))
        return status

    @staticmethod
    def _looks_dead(status: dict[str, Any]) -> bool:
        if status.get("pid"):
            return not process_alive(status["pid"], status.get("create_time"))
        # No process recorded (yet): a launcher records it right after starting one, so only for a short while.
        updated = status.get("updated")
        return not isinstance(updated, (int, float)) or time.time() - updated > START_GRACE_S

    def _death_report(self, status: dict[str, Any]) -> dict[str, Any]:
        last = self.last_step()
        if not status.get("pid"):
            error = (
                f"the run process never started (no process recorded {START_GRACE_S:.0f} s after launch); "
                f"see {self.log_path}"
            )
        else:
            error = (
                f"the run process (pid {status['pid']}) ended without reporting a result "
                f"(killed, out of memory, or the machine restarted); last step written: {last}"
            )
        return {"error": error, "step": last}

    @property
    def state(self) -> str:
        return self.status().get("state", "unknown")

    # --- contents --------------------------------------------------------------------------------------------

    def metrics(self) -> list[dict[str, Any]]:
        """Every record, as a list (for a run's own few hundred steps; views fold `records()` or a RunSummary)."""
        return list(self.records())

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, read in bounded pieces: memory for one piece, not for the whole file."""
        return stream_records(self.path)

    def last_step(self) -> int:
        return summary_of(self.path).step

    def result(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.result_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def last_checkpoint(self) -> Path | None:
        if not self.checkpoints.exists():
            return None
        found = [p for p in self.checkpoints.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
        complete = [p for p in found if _checkpoint_complete(p)]
        return max(complete, key=lambda p: int(p.name.split("-")[-1]), default=None)

    def request_stop(self) -> None:
        self.stop_path.parent.mkdir(exist_ok=True)
        self.stop_path.write_text(str(time.time()))

    def stop_requested(self) -> bool:
        return self.stop_path.exists()

    pause_path = property(lambda self: self.path / "control" / "pause")

    def pause_requested(self, step: int) -> bool:
        """Is the run to hold before the step after `step`? The file holds the step to pause at (empty: now)."""
        try:
            text = self.pause_path.read_text().strip()
        except FileNotFoundError:
            return False
        return not text.isdigit() or step >= int(text)

    def clear_stop(self) -> None:
        self.stop_path.unlink(missing_ok=True)
