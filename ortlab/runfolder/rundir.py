"""The run directory: everything a run is, on disk, readable by any process at any time.

    spec.yaml          the RunSpec, as run
    status.json        pending | running | completed | failed | stopped, with pid, step, error and traceback
    metrics.jsonl      append-only metrics stream (one JSON object per line; see ortlab.train.metricswriter)
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

Run names are folder names under the runs root (`ortlab.runfolder.naming`): `check_name` allows a safe alphabet
only, and `run_folder` turns an id from a user, the CLI or a server into a folder that is inside the root (no `..`,
no absolute paths, no symlink out of it).

A run folder is untrusted input (copied from someone, unpacked from an archive, planted under the runs root):
every file in it is opened through `ortlab.safeio` (no link followed below the folder, bounded reads, writes that
replace a file instead of writing into it). A folder that is not what it claims is shown as `damaged`, with the
reason in the status's `damaged` field: a status.json that is a link, a FIFO, too large or not a status, or a
status naming a live process that is not this run's (a forged or stale pid). `damaged` is what a reader sees, never
a state written to disk (it is not in STATES): it leaves the state machine as it is, no transition leads to it,
and Stop and Resume refuse it (nothing is signalled, nothing started) until the folder is repaired or removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.errors import OrtlabError
from ortlab.runfolder.naming import OutputFolderError, check_name, default_name
from ortlab.runfolder.processes import process_alive, run_process
from ortlab.runfolder.stream import METRICS_FILE, MetricsStream, summary_of
from ortlab.runfolder.stream import records as stream_records

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
# The states a resume may claim: those `pending` may follow (a resume is the claim of a run by a new worker).
RESUMABLE = frozenset(
    state for state, nexts in TRANSITIONS.items() if state is not None and "pending" in nexts - {state}
)
# A run that was claimed but whose process never recorded itself is declared failed after this long.
START_GRACE_S = 120.0
# What a reader sees for a folder whose status cannot be trusted (never written: see the module's docstring).
DAMAGED = "damaged"
# spec.yaml is a page of YAML: a file far larger than this is not one.
SPEC_MAX_BYTES = 1024 * 1024


class RunStateError(OrtlabError, RuntimeError):
    """A status change the run's current state does not allow (the message says which and why)."""


def read_metrics(path: Path, offset: int = 0, max_bytes: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines from byte `offset` on, and the offset after the last line read.

    A line still being written (no newline yet), or cut short by a killed process, is not returned; a reader
    following the file picks it up on its next call once it is complete. `max_bytes` bounds one read (a server
    answering from offset 0 on a long run); the rest comes on the next call, from the offset returned. The reading
    itself (bounded lines, no links followed, damaged lines passed over) is `ortlab.runfolder.stream.MetricsStream`.
    """
    path = Path(path)
    stream = MetricsStream(path.parent, offset, name=path.name)
    return stream.read(max_bytes), stream.offset


def _checkpoint_complete(path: Path) -> bool:
    """Trainer writes a checkpoint's trainer_state.json last (and not atomically): a checkpoint is whole when
    that file exists and parses. One cut by a crash, a kill or a full disk is passed over, and so is one whose
    state file is a link (read without following it)."""
    try:
        return isinstance(safeio.read_json(path, "trainer_state.json"), dict)
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
        name = check_name(
            name
            or spec.name
            or default_name(getattr(getattr(spec, "task_record", None), "short", "run"), spec.model.name)
        )
        base = Path(root)
        fix = "choose another output folder (--output-dir, or output_dir in the spec)"
        try:
            base.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OutputFolderError(f"the output folder {base} is a file, or a file is in its path: {fix}") from None
        except OSError as e:
            raise OutputFolderError(f"cannot create the output folder {base}: {e.strerror}; {fix}") from None
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
        safeio.write_bytes(path, "spec.yaml", spec.to_yaml().encode("utf-8"))
        run.set_status("pending")  # last: only a folder with a status is a run (`runs()` lists no other)
        return run

    def spec_text(self) -> str:
        """spec.yaml as text, read without following a link and with a bound (SPEC_MAX_BYTES). OSError when it is
        missing, a link, a FIFO or too large; `ortlab.spec.RunSpec.from_run` turns it into a RunSpec (the spec
        stands above the run folder, so the folder hands out text, not a RunSpec)."""
        return safeio.read_bytes(self.path, "spec.yaml", SPEC_MAX_BYTES).decode("utf-8", errors="replace")

    # --- status --------------------------------------------------------------------------------------------

    def read_status(self) -> dict[str, Any]:
        """status.json as written (no liveness check); `missing`, or `damaged` with the reason, when it is not a
        status: a link, a FIFO, larger than safeio.MAX_JSON_BYTES, not JSON, not an object, an unknown state."""
        try:
            status = safeio.read_json(self.path, "status.json")
        except FileNotFoundError:
            return {"state": "missing"}
        except OSError as e:  # UnsafePath (a link, a FIFO), TooLarge, an unreadable file
            return _damaged(f"status.json cannot be read safely: {e.strerror or e}")
        except ValueError as e:
            return _damaged(f"status.json is not JSON ({e})")
        if not isinstance(status, dict) or status.get("state") not in STATES:
            return _damaged(f"status.json is not a run status (its state must be one of {', '.join(STATES)})")
        if not isinstance(status.get("pid"), (int, type(None))) or isinstance(status.get("pid"), bool):
            status["pid"] = None  # a hand-edited pid is no pid: never signalled, never trusted
        created = status.get("create_time")
        if not isinstance(created, (int, float, type(None))) or isinstance(created, bool):
            status["create_time"] = None
        return status

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's status lock (across processes; a lock file, released if the holder dies).

        The lock file is opened without following a link (a planted `.status.lock` link would otherwise be
        created or opened wherever it points): safeio.UnsafePath instead."""
        fd = safeio.open_in(self.path, ".status.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def set_status(self, state: str, expect: frozenset[str] | set[str] | None = None, **fields: Any) -> dict[str, Any]:
        """Move the run to `state`, keeping its identity fields. Raises RunStateError when the current state
        does not allow it (see TRANSITIONS), or is not one of `expect` when given."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        with self.locked():
            return self._set_status_locked(state, expect, fields)

    def claim(self, **fields: Any) -> dict[str, Any]:
        """Claim a stopped or failed run for a resume (`pending`), clearing its stop and pause requests.

        Both under the status lock, the requests cleared before the status says `pending`: whoever sees the claim
        and asks for a stop (the sidebar's Stop, `Run.stop`) asks after the clear, so that stop always reaches
        the new worker. (Clearing after the claim, outside the lock, erased a stop asked for in between.)
        Raises RunStateError when the run is not stopped or failed (a second resume, a running run).
        """
        with self.locked():
            self._check_transition("pending", RESUMABLE)
            self.clear_stop()
            self.clear_pause()
            return self._set_status_locked("pending", RESUMABLE, fields)

    def _check_transition(self, state: str, expect: Any) -> dict[str, Any]:
        current = self.read_status() if safeio.exists(self.path, "status.json") else {}
        now_state = current.get("state")
        if now_state in ("missing", DAMAGED):
            # Only the folder's own writers get here (under the lock): a worker may still record its real state
            # over a status that was damaged, replacing the file (never writing into it). A resume is refused.
            now_state = None if now_state == "missing" else "pending"
        allowed = TRANSITIONS.get(now_state, frozenset(STATES))
        if state not in allowed or (expect is not None and now_state not in expect):
            raise RunStateError(f"run {self.id} is {now_state}: it cannot become {state}")
        return current

    def _set_status_locked(self, state: str, expect: Any, fields: dict[str, Any]) -> dict[str, Any]:
        current = self._check_transition(state, expect)
        identity = ("pid", "create_time", "started", "launcher", "runtime", "python", "world_size", "worker_pid")
        keep = {k: v for k, v in current.items() if k in identity}
        status = {**keep, **fields, "state": state, "updated": time.time()}
        if state in TERMINAL:
            status.setdefault("ended", time.time())
        safeio.write_json(self.path, self.status_path.name, status)
        return status

    def update_status(self, **fields: Any) -> dict[str, Any]:
        """Add fields (a pid, a step) to the status without changing its state."""
        with self.locked():
            current = self.read_status()
            if current.get("state") == DAMAGED:
                raise RunStateError(f"run {self.id} is damaged: {current[DAMAGED]}")
            status = {**current, **fields, "updated": time.time()}
            safeio.write_json(self.path, self.status_path.name, status)
            return status

    def status(self) -> dict[str, Any]:
        """The status, after checking that a pending/running run still has a live process of its own (or,
        pending without one, that it was claimed only recently). A status naming a live process that is not this
        run's is `damaged` (see `run_process`): shown with its reason, never trusted, never written."""
        status = self.read_status()
        if status.get("state") in ("pending", "running"):
            if self._looks_dead(status):
                try:
                    with self.locked():  # re-check under the lock: the worker may have ended properly meanwhile
                        status = self.read_status()
                        if status.get("state") in ("pending", "running") and self._looks_dead(status):
                            status = self._set_status_locked("failed", None, self._death_report(status))
                except OSError as e:  # a planted .status.lock (a link, a FIFO): say so, write nothing
                    return _damaged(f".status.lock cannot be opened safely: {e.strerror or e}", status)
            elif run_process(self.path, status) == "foreign":
                return _damaged(
                    f"status.json says {status['state']} with pid {status['pid']}, but that process is not this "
                    "run's (it does not run this folder): the status is forged or stale; nothing is signalled",
                    status,
                )
        return status

    def open_log(self) -> int:
        """logs/run.log opened for append, without following a link (a planted `logs/run.log -> ~/.bashrc` would
        otherwise get the run's output appended to it); a raw descriptor for the caller to close.

        A run process keeps it open while it runs: that open file is how `run_process` knows the process is this
        run's, whatever its command line (an in-process run in a notebook kernel)."""
        return safeio.open_in(self.path, "logs/run.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def owns_process(self, status: dict[str, Any]) -> bool:
        """Is the process `status` records a live process of this very run (safe to signal)?"""
        return run_process(self.path, status) == "ours"

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

    def records(self, name: str = METRICS_FILE) -> Iterator[dict[str, Any]]:
        """Every record of a JSON-lines file of the run (its metrics by default), read in bounded pieces: memory
        for one piece, not for the whole file."""
        return stream_records(self.path, name=name)

    def follow(self, name: str = METRICS_FILE, on_restart: Callable[[], None] | None = None) -> MetricsStream:
        """The records of `name` as they are added: each `read()` returns the new complete ones (bounded)."""
        return MetricsStream(self.path, name=name, on_restart=on_restart)

    def append_records(self, name: str, records: list[dict[str, Any]]) -> None:
        """JSON lines appended to a file of the run (opened without following a link)."""
        fd = safeio.open_in(self.path, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, "".join(safeio.dumps(r) + "\n" for r in records).encode())
        finally:
            os.close(fd)

    def read_small(self, name: str, limit: int = safeio.MAX_JSON_BYTES) -> bytes:
        """A small file of the run (result.json, ...), never through a link, bounded; FileNotFoundError when absent."""
        return safeio.read_bytes(self.path, name, limit=limit)

    # A job's node-local copy pushed here and followed from here, as a stored run's is (`ortlab.job.mirror`).
    def read_tail(self, name: str, start: int) -> Iterator[bytes]:
        with contextlib.suppress(FileNotFoundError), os.fdopen(safeio.open_in(self.path, name), "rb") as f:
            f.seek(start)
            yield from iter(lambda: f.read(1 << 20), b"")

    def put_file(self, folder: Path, name: str) -> None:
        with os.fdopen(safeio.open_in(folder, name), "rb") as src:
            safeio.write_pieces(self.path, name, iter(lambda: src.read(1 << 20), b""))

    def put_folder(self, folder: Path, rel: str) -> list[str]:
        return safeio.copy_files(folder, rel, self.path / rel)

    def mark_whole(self, rel: str) -> None:
        """Nothing to mark: a checkpoint in a folder is whole when its trainer_state.json parses."""

    def has(self, rel: str) -> bool:
        return safeio.exists(self.path, rel)

    def fetch(self, rel: str, folder: Path, dest: str) -> list[str]:
        """The regular files below `rel` copied into `folder/dest` (never what a link points to); what was left
        behind, as "path (why)"."""
        return safeio.copy_files(self.path, rel, Path(folder) / dest)

    def last_step(self) -> int:
        return summary_of(self.path).step

    def result(self) -> dict[str, Any] | None:
        """result.json, or None when it is absent or not a plain JSON object (see `read_result` for why)."""
        return self.read_result()[0]

    def read_result(self) -> tuple[dict[str, Any] | None, str | None]:
        """(result.json, None), or (None, why not): absent, a link, a FIFO, too large, not a JSON object."""
        try:
            result = safeio.read_json(self.path, "result.json")
        except FileNotFoundError:
            return None, None
        except OSError as e:
            return None, f"result.json cannot be read safely: {e.strerror or e}"
        except ValueError as e:
            return None, f"result.json is not JSON ({e})"
        if not isinstance(result, dict):
            return None, "result.json is not a JSON object"
        return result, None

    def model_not_own(self) -> list[str]:
        """What in model/ is not the run's own file (links, FIFOs...), as "model/x (why)": a model loaded from
        here by path follows them, and export and publish would carry what a link points at (a `vocab.txt` linked
        to a private key becomes a published tokenizer's vocabulary)."""
        return safeio.not_regular(self.path, "model")

    def last_checkpoint_name(self) -> str | None:
        last = self.last_checkpoint()
        return None if last is None else last.name

    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint; a linked checkpoints/ folder or linked checkpoint-N is passed over (a
        resume would load whatever it points to)."""
        if self.checkpoints.is_symlink():
            return None
        try:
            entries = [e for e in os.scandir(self.checkpoints) if e.name.startswith("checkpoint-")]
        except OSError:
            return None
        found = [
            Path(e.path)
            for e in entries
            if checkpoint_step(e.name) is not None and e.is_dir(follow_symlinks=False) and not e.is_symlink()
        ]
        complete = [p for p in found if _checkpoint_complete(p)]
        return max(complete, key=lambda p: checkpoint_step(p.name) or 0, default=None)

    def request_stop(self) -> None:
        """Ask for a graceful stop: control/stop is created by replacing whatever is there (a planted link is
        replaced, never written through); safeio.UnsafePath when control/ itself is a link."""
        safeio.write_bytes(self.path, "control/stop", str(time.time()).encode())

    def stop_requested(self) -> bool:
        return safeio.exists(self.path, "control/stop")

    pause_path = property(lambda self: self.path / "control" / "pause")

    def request_pause(self, at_step: int | None = None) -> None:
        """Hold the run after its current step (or once `at_step` steps are done); see `pause_requested`."""
        safeio.write_bytes(self.path, "control/pause", b"" if at_step is None else str(int(at_step)).encode())

    def read_pause(self) -> str | None:
        """The pause request: None when there is none, else the step to pause at ("" for now). A pause file that
        cannot be read as one (a link, a FIFO, too long) means now: its presence is the ask."""
        try:
            return safeio.read_bytes(self.path, "control/pause", 64).decode("ascii", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError:
            return "" if safeio.exists(self.path, "control/pause") else None

    def pause_requested(self, step: int) -> bool:
        """Is the run to hold before the step after `step`? The file holds the step to pause at (empty: now)."""
        text = self.read_pause()
        if text is None:
            return False
        at = pause_step(text)
        return at is None or step >= at

    def clear_stop(self) -> None:
        safeio.remove(self.path, "control/stop")

    def clear_pause(self) -> None:
        safeio.remove(self.path, "control/pause")


def pause_step(text: str) -> int | None:
    """The step a pause request names (its file holds ASCII digits), or None (no step: pause now)."""
    return safeio.ascii_int(text)


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder's name (`checkpoint-120`), or None for any other name (`checkpoint-²`)."""
    prefix, _, step = name.rpartition("-")
    return safeio.ascii_int(step) if prefix == "checkpoint" else None


def _damaged(reason: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a reader sees for a folder whose status cannot be trusted: state `damaged`, the reason, and the
    recorded state (if any) for the curious; never written to disk."""
    recorded = (status or {}).get("state")
    out: dict[str, Any] = {"state": DAMAGED, DAMAGED: reason}
    if recorded and recorded != DAMAGED:
        out["recorded_state"] = recorded
    for key in ("step", "updated"):
        if status and key in status:
            out[key] = status[key]
    return out
