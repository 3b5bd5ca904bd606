"""Job side: a node-local copy of a run place, kept in step with it (for a place with no folder to open here).

A job trains in a folder on its node (`node_folder`) when the place is not a folder it can open (an object store,
`objstore`; see `place.folder_here`): `Mirror` pulls the run from the place at the start, then a thread pushes
status, stream and whole checkpoints out and pulls stop and pause in while it trains, and pushes the results at the
end. A Ray Train driver, which trains nothing, keeps a copy that `Follower` extends from the place's stream, for the
driver to print to the local monitor. Every transfer goes through the `RunPlace` interface (for a stored run: no key
outside the run, downloads through `safeio`, reads bounded), so neither asks which kind of place it holds.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ortlab import safeio
from ortlab.runfolder.objstore import SMALL, read_limit
from ortlab.runfolder.place import RunPlace
from ortlab.runfolder.rundir import RunDir, pause_step

SYNC_S = 1.0  # how often the job pulls stop/pause and pushes its status
METRICS_SYNC_S = 10.0  # ... and its metrics.jsonl (the live records go through the job's log; this is the backup)
WATCH_S = 0.05  # how often rank 0 looks at its stream (a local stat): a new record waits this long, not LIVE_S
# An object cannot be appended to, so a pushed stream is rewritten whole: a long one is pushed less often, to keep
# under this many bytes a second (a 250 KB stream every LIVE_S, a 10 MB one every 10 s).
STREAM_PUSH_BYTES_PER_S = 1 << 20


def jobs_dir() -> Path:
    """Where jobs keep their node-local copies of runs on a node (each removed when its job ends cleanly): this
    user's own 0700 folder (one shared by all users let them read the copies, and its first maker own it)."""
    return safeio.private_folder(Path(tempfile.gettempdir()) / f"ortlab-jobs-{os.getuid()}")


def node_folder(place: RunPlace) -> RunDir:
    """A fresh node-local folder for the job's copy of the run (named after the run, so logs read naturally)."""
    return RunDir(Path(tempfile.mkdtemp(prefix=f"{secrets.token_hex(3)}-", dir=jobs_dir())) / place.id)


class Mirror:
    """The job's node-local run folder and its run place: pulled once at the start, then kept in step by a
    thread (stop and pause in, status and metrics out, each checkpoint once it is whole), and pushed whole at the
    end (the results, the last checkpoint)."""

    def __init__(self, place: RunPlace, local: RunDir, checkpoints: bool = True, metrics_every: float = METRICS_SYNC_S):
        """`checkpoints`: push each whole checkpoint from here (a Ray Train run uploads them from every node
        instead, see `ortlab.job.raytrain`); `metrics_every`: seconds between pushes of metrics.jsonl at least (the
        local monitor of a Ray Train run reads it from the store, so its rank 0 pushes it every LIVE_S)."""
        self.place, self.local = place, local
        self.checkpoints, self.metrics_every = checkpoints, metrics_every
        self.pushed_checkpoints: set[str] = set()
        self.sent: dict[str, tuple[int, int, int]] = {}  # (inode, size, mtime) of each file when last pushed
        self.metrics_at = self.rest_at = 0.0

    def pull(self, resume: bool, controls: bool = True) -> None:
        """The spec and status, and for a resume the history and the last finished checkpoint. `controls`: the
        stop and pause requests too (in a Ray Train run only rank 0's node takes them: the ranks agree on rank
        0's view, and a pause copied to another node at its start would never be lifted there)."""
        self.local.path.mkdir(parents=True, exist_ok=True)
        for rel in ("logs", "control"):
            (self.local.path / rel).mkdir(exist_ok=True)
        for name in (*SMALL, "metrics.jsonl") if resume else ("spec.yaml", "status.json"):
            with contextlib.suppress(FileNotFoundError):
                safeio.write_bytes(self.local.path, name, self.place.read_small(name, limit=read_limit(name)))
        if controls:
            self.pull_controls()
        else:  # (this node's folder may have been rank 0's in the group before: its requests are stale here)
            self.local.clear_stop()
            self.local.clear_pause()
        if resume:
            # Only the stored checkpoint is whole on every node: one this node wrote after it (its upload cut by
            # a failure) would have a resume start from a step the other nodes never saved.
            shutil.rmtree(self.local.checkpoints, ignore_errors=True)
            last = self.place.last_checkpoint_name()
            if last is not None:
                self.place.fetch(f"checkpoints/{last}", self.local.path, f"checkpoints/{last}")
                self.pushed_checkpoints.add(last)

    def pull_controls(self) -> None:
        if self.place.stop_requested() and not self.local.stop_requested():
            self.local.request_stop()
        pause = self.place.read_pause()  # (odd contents read as "now", never raised: see read_pause)
        if pause is None:
            self.local.clear_pause()
        elif self.local.read_pause() != pause:
            self.local.request_pause(pause_step(pause))

    def push_small(self, names: tuple[str, ...]) -> list[str]:
        """Each of `names` that changed since it was last pushed (by its size and modification time: the stream
        is not read whole every second to find that nothing was added), copied in pieces: a stream past any
        bound is still pushed, with flat memory. Returns the names pushed."""
        pushed = []
        for name in names:
            try:
                info = os.stat(self.local.path / name, follow_symlinks=False)
                seen = (info.st_ino, info.st_size, info.st_mtime_ns)
                if self.sent.get(name) == seen:
                    continue
                self.place.put_file(self.local.path, name)
            except FileNotFoundError:
                continue
            self.sent[name] = seen
            pushed.append(name)
        return pushed

    def push_checkpoints(self) -> None:
        """Every whole local checkpoint not pushed yet: its files, then the mark that says it is whole."""
        if not self.checkpoints:
            return
        last = self.local.last_checkpoint()
        if last is None or last.name in self.pushed_checkpoints:
            return
        rel = f"checkpoints/{last.name}"
        self.place.put_folder(self.local.path, rel)
        self.place.mark_whole(rel)
        self.pushed_checkpoints.add(last.name)

    def sync(self, force: bool = False) -> None:
        """The stream when it grew and is due, the rest when due (see `push_stream`, `push_rest`); `force`: all of
        it now."""
        _each([lambda: self.push_stream(force), lambda: self.push_rest(force)])

    def push_stream(self, force: bool = False) -> None:
        """The stream, if it grew (a local stat, no request, when it did not) and its last push was at least
        `_metrics_interval()` ago. Leading edge: a record written after a quiet spell goes out at the next look,
        a burst of records in the pushes one interval apart (at most one PUT per interval, whatever the step rate)."""
        now = time.monotonic()
        if not force and now - self.metrics_at < self._metrics_interval():
            return
        if self.push_small(("metrics.jsonl",)):
            self.metrics_at = now

    def push_rest(self, force: bool = False) -> None:
        """Every SYNC_S (`force`: now): stop and pause in, whole checkpoints and the status out."""
        now = time.monotonic()
        if force or now - self.rest_at >= SYNC_S:
            self.rest_at = now
            _each([self.pull_controls, self.push_checkpoints, lambda: self.push_small(("status.json", "tune.json"))])

    def _metrics_interval(self) -> float:
        try:
            size = os.stat(self.local.metrics_path, follow_symlinks=False).st_size
        except OSError:
            size = 0
        return max(self.metrics_every, size / STREAM_PUSH_BYTES_PER_S)

    def push_end(self) -> None:
        """Everything a finished (or stopped, or failed) run leaves: the last checkpoint, the results, the model,
        the stream and the final status (last: a status that says `completed` finds the model there)."""
        steps = [self.push_checkpoints, lambda: self.push_small(("metrics.jsonl", "tune.json", "result.json"))]
        if self.local.model_dir.is_dir():
            steps.append(lambda: self.place.put_folder(self.local.path, "model"))
        _each(steps)
        self.push_small(("status.json",))

    @contextlib.contextmanager
    def syncing(self) -> Iterator[None]:
        """`sync` while the block trains, then `push_end`. A live stream (`metrics_every` under SYNC_S: a Ray Train
        rank 0, whose stream the local monitor reads from the store) is looked at every WATCH_S in a thread of its
        own, so that a push never waits behind the requests of the controls, checkpoints and status."""
        what = f"syncing with {self.place.path}"
        if self.metrics_every >= SYNC_S:
            with _repeating(self.sync, what, self.push_end, SYNC_S):
                yield
            return
        # (the stream's thread is ended first: push_end then pushes the stream's last records, one writer at a time)
        with _repeating(self.push_rest, what, self.push_end, SYNC_S), _repeating(self.push_stream, what, _no, WATCH_S):
            yield


class Follower:
    """A Ray Train driver's node-local copy of the run, following its place: rank 0 (wherever Ray placed it)
    pushes its stream and status there, and the driver prints them for the monitor from this copy (the job's log
    channel; the monitor reads the stored stream itself as well, which is the faster way home, so this copy is
    pulled once a second). The stream is only ever extended (a new rank 0 starts from the stored one), so what is
    new is read from where the local copy ends."""

    def __init__(self, place: RunPlace, local: RunDir):
        self.place, self.local = place, local

    def pull(self) -> None:
        """The status, and the stream's new part if it grew (one request to learn that it did not; none until rank
        0's first push: nothing to read, nothing to say)."""
        with contextlib.suppress(FileNotFoundError):
            safeio.write_bytes(self.local.path, "status.json", self.place.read_small("status.json"))
        have = self.local.metrics_path.stat().st_size if self.local.metrics_path.is_file() else 0
        out = None
        try:
            for piece in self.place.read_tail("metrics.jsonl", have):
                if out is None:
                    fd = safeio.open_in(self.local.path, "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                    out = os.fdopen(fd, "ab")
                out.write(piece)
        finally:
            if out is not None:
                out.close()

    def following(self) -> contextlib.AbstractContextManager[None]:
        """`pull` every SYNC_S seconds while the block runs, and once more after it."""
        return _repeating(self.pull, f"reading {self.place.path}", self.pull, SYNC_S)


def _no() -> None:
    pass


def _each(steps: list[Callable[[], None]]) -> None:
    """Every step, each on its own: one that fails (a store hiccup, an odd file) does not keep the others from
    running (a stream past its bound once kept control, checkpoints and status from being pushed at all); the first
    failure is raised after the rest have run."""
    failed: Exception | None = None
    for step in steps:
        try:
            step()
        except Exception as e:
            failed = failed or e
    if failed is not None:
        raise failed


@contextlib.contextmanager
def _repeating(step: Callable[[], None], what: str, last: Callable[[], None], every: float) -> Iterator[None]:
    """`step()` every `every` seconds in a thread while the block runs, then `last()` once the thread has ended. A
    failed step (a store hiccup) is said in the job's log and tried again next time."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            try:
                step()
            except Exception as e:
                print(f"[ortlab storage] {what} failed: {e}", flush=True)

    thread = threading.Thread(target=loop, daemon=True, name="ortlab-storage")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        last()
