"""Reading a run's metrics stream: one bounded, incremental reader, and the one fold of its records.

Every view of a run (the server's run list and metrics route, the workbench, `ortlab runs`/`compare`/`follow`, the
training terminal) reads `metrics.jsonl`, a file that anything may have written: a run folder can be copied from
anywhere. Reading it the ordinary way (`f.read()`, `splitlines()`) failed in four ways, each seen:

- a 171 MiB file was read whole under the server's index lock: 10 s, and the Jupyter server went from 103 MB to
  1.69 GB while every other request waited;
- a line longer than one read (8 MiB) was never consumed, so the sidebar stalled on that run for ever;
- `splitlines()` also splits on a bare `\\r` (and other Unicode line ends), so one `\\r` inside a line made the
  reader stop there, every time;
- the workbench re-read every run's whole file every 2 s.

So `MetricsStream` follows the file from a remembered offset, reads at most `max_bytes` per call (in pieces of
`PIECE_BYTES`), splits on `b"\\n"` only, and caps a line at `LINE_LIMIT`: a longer line is passed over by scanning to
its newline without holding it. A line that is not UTF-8, not JSON, or not a JSON object is passed over too. Every
line passed over is counted and the latest few kept as `Skip`s (offset, length, why), so a view can say "3 lines
could not be read" instead of going quiet. The file is opened without following a link (`safeio.open_in`), and only
a regular file is read (a FIFO would block, a device never ends). Numbers JSON cannot hold (`NaN`, `Infinity`,
`1e999`) are read as None, so a record read here can always be sent on as JSON.

`RunSummary` is the one fold of the records `ortlab.train.metricswriter` writes (their fields are in `records`, their
event names in `events`; a test holds every field the fold reads to `records`): the latest step, loss and throughput,
what applied, the last scores, and the steady-state throughput that `ortlab.runfolder.compare.summarize` defines, all
kept incrementally, so a view that follows a run folds each record once. `SummaryFollower` keeps one run's summary
current from the bytes appended since its last call (a replaced or cut file is read afresh).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.runfolder import events
from ortlab.runfolder.lines import parse_line, parse_plain, plain_numbers

METRICS_FILE = "metrics.jsonl"
LINE_LIMIT = 2**20  # no record ortlab writes comes near this (a step is ~300 bytes, an `auto` table a few KiB)
CHUNK_BYTES = 8 * 2**20  # what one bounded call reads by default
PIECE_BYTES = 2**20  # one read(2): the most held at once, besides one line of up to LINE_LIMIT
MAX_SKIPS_KEPT = 20
EVAL_KEYS = ("eval_accuracy", "eval_f1", "eval_exact_match", "eval_token_f1", "eval_perplexity", "eval_loss")
_MAX_WORKERS = 1024  # a step line's `workers` list longer than this is not ortlab's (64 processes at most)
_MAX_ACCELERATIONS = 64  # names kept from one record (ortlab has a handful): a hostile record cannot grow a row
_MAX_TEXT = 100


@dataclass(frozen=True)
class Skip:
    """A line passed over: where it starts (a byte offset in the file), how long it is, and why."""

    offset: int
    length: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "length": self.length, "reason": self.reason}


class MetricsStream:
    """Follows one metrics file from a remembered byte offset, a bounded number of bytes per call.

    `offset` is always at the start of a line or inside a line being passed over; a stream created at an offset that
    is inside a line (a client's offset, a cut file) passes over the rest of that line. `on_restart` is called when
    the file turns out to have been replaced or cut since the last call: the stream then reads it from the start.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        offset: int = 0,
        name: str = METRICS_FILE,
        line_limit: int = LINE_LIMIT,
        on_restart: Callable[[], None] | None = None,
    ):
        self.folder, self.name, self.offset = Path(folder), name, offset
        self.line_limit = line_limit
        self.on_restart = on_restart
        self.size = 0  # the file's size when last opened
        self.mtime = 0.0  # and its modification time
        self.caught_up = False  # did the last call read on to the end of the file (not stop at its budget)?
        self.identity: tuple[int, int] | None = None  # (device, inode) of the file last read
        self.skipped = 0
        self.skips: list[Skip] = []  # the latest MAX_SKIPS_KEPT
        self.problem: str | None = None  # why the file could not be read at all (a link, not a regular file)
        self._passing_from: int | None = None  # where the long line being passed over began

    def read(self, max_bytes: int | None = CHUNK_BYTES) -> list[dict[str, Any]]:
        return list(self.records(max_bytes))

    def records(self, max_bytes: int | None = CHUNK_BYTES) -> Iterator[dict[str, Any]]:
        """The complete records after `offset`, reading at most about `max_bytes` (None: to the end of the file, in
        bounded pieces). `offset` moves past each line as it is handed out: a caller that stops early resumes there.
        A line still being written (no newline yet) is left for a later call."""
        try:
            fd = safeio.open_in(self.folder, self.name)
        except FileNotFoundError:
            self.size, self.problem, self.caught_up = 0, None, True
            return
        except OSError as e:  # safeio.UnsafePath (a link, a FIFO), permissions
            self.size, self.problem, self.caught_up = 0, str(e), True
            return
        try:
            self.problem = None
            st = os.fstat(fd)
            read_at = functools.partial(os.pread, fd)
            yield from self.records_from(read_at, st.st_size, (st.st_dev, st.st_ino), st.st_mtime, max_bytes)
        finally:
            os.close(fd)

    def records_from(
        self,
        read_at: Callable[[int, int], bytes],
        size: int,
        identity: tuple[int, int] | None = None,
        mtime: float = 0.0,
        max_bytes: int | None = CHUNK_BYTES,
    ) -> Iterator[dict[str, Any]]:
        """`records`, from any source that reads `n` bytes at an offset (`read_at(n, offset)`, as os.pread does):
        a stored run's metrics in an object store are read by this same bounded reader. `identity` tells a
        replaced file from a grown one (None: not known, only a shrunk size says it was cut)."""
        self.size, self.mtime, self.caught_up = size, mtime, False
        replaced = identity is not None and self.identity is not None and identity != self.identity
        if replaced or size < self.offset:
            self.offset, self.skipped, self.skips, self._passing_from = 0, 0, [], None
            if self.on_restart is not None:
                self.on_restart()
        self.identity = identity
        # Inside a line (its previous byte is not a newline): that line's rest is passed over, not parsed as a record.
        passing = self.offset > 0 and read_at(1, self.offset - 1) != b"\n"
        passing_from = self._passing_from if passing and self._passing_from is not None else self.offset
        too_long = f"longer than {self.line_limit} bytes"
        passing_why = too_long if self._passing_from is not None else "the rest of a line begun before the offset"
        pos, buf, done, began = self.offset, b"", 0, self.offset  # `buf` holds the file's bytes from `pos` on
        # Past the budget only while no line has ended yet: a line of up to line_limit bytes is always read whole.
        while max_bytes is None or done < max_bytes or self.offset == began:
            want = PIECE_BYTES if max_bytes is None or done >= max_bytes else min(PIECE_BYTES, max_bytes - done)
            piece = read_at(want, pos + len(buf))
            if not piece:
                self.caught_up = True
                break
            done += len(piece)
            buf += piece
            start = 0
            if passing:
                newline = buf.find(b"\n")
                if newline < 0:  # still inside the long line: let go of what was read
                    pos, buf = pos + len(buf), b""
                    self.offset = pos
                    continue
                passing, start, self._passing_from = False, newline + 1, None
                self.offset = pos + start
                self._skip(passing_from, self.offset - 1 - passing_from, passing_why)
            end = buf.rfind(b"\n", start) + 1  # the complete lines are buf[start:end]
            if end:
                # The fast parse where no number in these lines can overflow a float (see `lines`): same records.
                parse = parse_plain if plain_numbers(buf[start:end]) else parse_line
                at = pos + start
                for line in buf[start : end - 1].split(b"\n"):
                    line_at, at = at, at + len(line) + 1
                    self.offset = at
                    if len(line) > self.line_limit:
                        self._skip(line_at, len(line), too_long)
                        continue
                    record = parse(line)
                    if isinstance(record, str):
                        self._skip(line_at, len(line), record)
                    else:
                        yield record
                start = end
            if len(buf) - start > self.line_limit:  # an unfinished line already too long: pass over it from here
                passing, passing_from, passing_why = True, pos + start, too_long
                self._passing_from = passing_from
                pos, buf = pos + len(buf), b""
                self.offset = pos
            else:
                pos, buf = pos + start, buf[start:]
        self.caught_up = self.caught_up or pos + len(buf) >= size

    def _skip(self, offset: int, length: int, reason: str) -> None:
        self.skipped += 1
        self.skips = [*self.skips[-(MAX_SKIPS_KEPT - 1) :], Skip(offset, length, reason)]


def records(folder: str | os.PathLike, name: str = METRICS_FILE) -> Iterator[dict[str, Any]]:
    """Every complete record of a run folder's metrics, read in bounded pieces (memory: one piece, not the file)."""
    yield from MetricsStream(folder, name=name).records(None)


def _number(value: Any) -> float | int | None:
    kind = type(value)
    if kind is float or kind is int:  # what JSON gives, checked first: a history folds ~10 numbers a line
        return value
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _step_number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _accelerations(value: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """What a record says was requested and applied, as names and two flags (a bounded copy, never the record)."""
    out: dict[str, dict[str, bool]] = {}
    for name, entry in value.items():
        if len(out) >= _MAX_ACCELERATIONS:
            break
        if isinstance(name, str) and len(name) <= _MAX_TEXT and isinstance(entry, dict):
            out[name] = {"requested": bool(entry.get("requested")), "applied": bool(entry.get("applied"))}
    return out


def _is_step(record: dict[str, Any]) -> bool:
    """A step record a throughput summary can use: ortlab writes these numbers on every step; a line without them
    (a damaged or hand-edited file) is left out rather than crashing every view of the run."""
    # (Spelled out, not all() over a generator: it runs for every step of a history.)
    return (
        isinstance(record.get("step"), int)
        and _number(record.get("step_time_s")) is not None
        and _number(record.get("samples")) is not None
        and _number(record.get("tokens")) is not None
    )


@dataclass
class _Throughput:
    """Steady-state throughput, kept as running sums: each training segment (a start, or a resume) has its own
    warm-up, its first `warmup_steps` steps counted apart (ORT's export and graph build land there)."""

    warmup_steps: int = 2
    segment_steps: int = 0
    steps: int | None = None
    warm_n: int = 0
    warm_time: float = 0
    final_loss: float | None = None
    peak_mem: float | None = None
    mem_kind: str | None = None
    seen_step: bool = False
    steady_n: int = 0
    steady_time: float = 0
    steady_samples: float = 0
    steady_tokens: float = 0
    mfu: list[float] = field(default_factory=lambda: [0, 0])  # sum of mfu * time, sum of time
    mfu_datasheet: list[float] = field(default_factory=lambda: [0, 0])  # a GPU's MFU against its datasheet peak
    tflops: list[float] = field(default_factory=lambda: [0, 0])
    gpu_max: dict[str, float] = field(default_factory=dict)
    # Several processes: each rank's steady step time, summed, and the steps counted (a straggler's is higher).
    worker_time: list[float] = field(default_factory=list)
    worker_n: int = 0

    def add(self, r: dict[str, Any]) -> None:
        self.seen_step = True
        step = r["step"]
        self.steps = step if self.steps is None else max(self.steps, step)
        t = r["step_time_s"]
        if self.segment_steps < self.warmup_steps:
            self.warm_n += 1
            self.warm_time += t
        else:
            self.steady_n += 1
            self.steady_time += t
            self.steady_samples += r["samples"]
            self.steady_tokens += r["tokens"]
            # The optional numbers (absent from most steps) are looked at only when present.
            for key, sums in (
                ("mfu", self.mfu),
                ("mfu_datasheet", self.mfu_datasheet),
                ("model_tflops_per_s", self.tflops),
            ):
                if key in r and _number(r[key]) is not None:
                    sums[0] += r[key] * t
                    sums[1] += t
            if "workers" in r:
                self._add_workers(r["workers"])
        self.segment_steps += 1
        self.final_loss = _number(r.get("loss"))
        if (mem := _number(r.get("peak_mem_mb"))) is not None:
            self.peak_mem = mem if self.peak_mem is None else max(self.peak_mem, mem)
        kind = r.get("mem_kind")
        self.mem_kind = kind[:_MAX_TEXT] if isinstance(kind, str) else None
        for key in ("gpu_mem_step_peak_mb", "gpu_mem_reserved_mb"):
            if key in r and _number(r[key]) is not None:
                self.gpu_max[key] = max(self.gpu_max.get(key, r[key]), r[key])

    def _add_workers(self, workers: Any) -> None:
        if not isinstance(workers, list) or not all(isinstance(w, dict) for w in workers):
            return
        times = [w.get("step_time_s") for w in workers]
        if not times or len(times) > _MAX_WORKERS or any(_number(t) is None for t in times):
            return
        if len(times) != len(self.worker_time):  # (a resumed run with another world size starts the sums again)
            self.worker_time, self.worker_n = [0.0] * len(times), 0
        self.worker_time = [a + b for a, b in zip(self.worker_time, times, strict=True)]
        self.worker_n += 1

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "steps": self.steps or 0,
            "warmup_steps": self.warm_n,
            "warmup_time_s": self.warm_time,
            "final_loss": self.final_loss,
            "peak_mem_mb": self.peak_mem,
            "mem_kind": self.mem_kind,
        }
        t = self.steady_time
        if self.steady_n and t > 0:
            out["steady_samples_per_s"] = self.steady_samples / t
            out["steady_tokens_per_s"] = self.steady_tokens / t
            out["steady_step_time_s"] = t / self.steady_n
            if self.mfu[1] > 0:
                out["steady_mfu"] = self.mfu[0] / self.mfu[1]
            if self.mfu_datasheet[1] > 0:
                out["steady_mfu_datasheet"] = self.mfu_datasheet[0] / self.mfu_datasheet[1]
            if self.tflops[1] > 0:
                out["steady_model_tflops_per_s"] = self.tflops[0] / self.tflops[1]
        for key in ("gpu_mem_step_peak_mb", "gpu_mem_reserved_mb"):
            if key in self.gpu_max:
                out[f"max_{key}"] = self.gpu_max[key]
        if self.worker_n:
            out["worker_step_time_s"] = [t / self.worker_n for t in self.worker_time]
        return out


class RunSummary:
    """What a run's metrics stream has said so far, folded one record at a time (thread-safe: a follower thread may
    fold while a view reads).

    - `step`: the latest step (the highest step number of a `step` record); `loss`, `samples_per_s`: the latest
      step's; `max_steps`: the total `train_begin` announced.
    - `accelerations`: {name: {requested, applied}} from the latest train_begin / verified / train_end; `verified`:
      whether a verified or train_end record said so (before that, "applied: false" means "not checked yet").
    - `scores`: the last `eval` record's headline scores (EVAL_KEYS); `eval_before`: the first "before" evaluation's
      eval_* numbers; `auto`: how the 'auto' accelerations were decided ("measured", "default", or None);
      `steady_samples_per_s`: from the train_end summary.
    - `throughput()`: steady-state throughput over every segment (what `ortlab.runfolder.compare.summarize` returns).
    - `world_size`: the training processes (train_begin); `restarts`: how often a worker group was restarted after
      a worker failed (`restart` records, Ray Train runs).
    - `records`, `skipped`, `skips`: records folded, lines passed over (see `MetricsStream`).
    """

    def __init__(self, warmup_steps: int = 2):
        self._lock = threading.Lock()
        self._throughput = _Throughput(warmup_steps)
        self.records = 0
        self.step = 0
        self.max_steps: int | None = None
        self.loss: float | None = None
        self.samples_per_s: float | None = None
        self.accelerations: dict[str, dict[str, bool]] = {}
        self.verified = False
        self.scores: dict[str, float] = {}
        self.eval_before: dict[str, float] | None = None
        self.auto: str | None = None
        self.steady_samples_per_s: float | None = None
        self.world_size = 1
        self.restarts = 0
        self.ended = False
        self.skipped = 0
        self.skips: list[Skip] = []

    def fold(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._fold(record)

    def fold_all(self, records: Any) -> RunSummary:
        for record in records:
            self.fold(record)
        return self

    def _fold(self, r: dict[str, Any]) -> None:
        self.records += 1
        event = r.get("event")
        if event == events.STEP:
            if (step := _step_number(r.get("step"))) is not None and step > self.step:
                self.step = step
            self.loss, self.samples_per_s = _number(r.get("loss")), _number(r.get("samples_per_s"))
            if _is_step(r):
                self._throughput.add(r)
        elif event == events.TRAIN_BEGIN:
            self._throughput.segment_steps = 0
            steps = _step_number(r.get("max_steps"))
            if steps is not None and steps > 0:
                self.max_steps = steps
            world = _step_number(r.get("world_size"))
            if world is not None and world > 0:
                self.world_size = world
        elif event == events.RESTART:
            self.restarts += 1
        elif event == events.EVAL:
            self.scores = {k: r[k] for k in EVAL_KEYS if _number(r.get(k)) is not None}
            if self.eval_before is None and r.get("phase") == "before":
                self.eval_before = {k: v for k, v in r.items() if isinstance(k, str) and k.startswith("eval_")}
        elif event == events.AUTO and self.auto is None and r.get("resolved"):
            self.auto = "measured" if r.get("tuned") else "default"
        elif event == events.TRAIN_END:
            self.ended = True
            summary = r.get("summary")
            if isinstance(summary, dict):
                self.steady_samples_per_s = _number(summary.get("steady_samples_per_s"))
        if event in events.WITH_ACCELERATIONS and isinstance(r.get("accelerations"), dict):
            self.accelerations = _accelerations(r["accelerations"])
            self.verified = self.verified or event != events.TRAIN_BEGIN

    @property
    def requested(self) -> list[str]:
        return [k for k, v in self.accelerations.items() if v["requested"]]

    @property
    def applied(self) -> list[str]:
        return [k for k, v in self.accelerations.items() if v["applied"]]

    def throughput(self) -> dict[str, Any]:
        with self._lock:
            return self._throughput.result()

    def view(self) -> dict[str, Any]:
        """The summary as plain data, consistent (taken under the lock), for a reader in another thread."""
        with self._lock:
            return {
                "records": self.records,
                "step": self.step,
                "max_steps": self.max_steps,
                "loss": self.loss,
                "samples_per_s": self.samples_per_s,
                "accelerations": dict(self.accelerations),
                "requested": self.requested,
                "applied": self.applied,
                "verified": self.verified,
                "scores": dict(self.scores),
                "auto": self.auto,
                "steady_samples_per_s": self.steady_samples_per_s,
                "world_size": self.world_size,
                "restarts": self.restarts,
                "ended": self.ended,
                "skipped": self.skipped,
                "skips": [s.to_dict() for s in self.skips],
                "throughput": self._throughput.result(),
            }


class SummaryFollower:
    """One run's `RunSummary`, kept current by reading only the bytes appended since the last `refresh`."""

    def __init__(self, folder: str | os.PathLike, warmup_steps: int = 2, name: str = METRICS_FILE):
        self.warmup_steps = warmup_steps
        self.summary = RunSummary(warmup_steps)
        self.stream = MetricsStream(folder, name=name, on_restart=self._restart)

    def _restart(self) -> None:
        self.summary = RunSummary(self.warmup_steps)  # the file was replaced or cut: what it said before is void

    def refresh(self, max_bytes: int | None = CHUNK_BYTES) -> RunSummary:
        """Fold in what was appended since the last call (at most about `max_bytes`; None: all of it)."""
        for record in self.stream.records(max_bytes):
            self.summary.fold(record)
        self.summary.skipped, self.summary.skips = self.stream.skipped, list(self.stream.skips)
        return self.summary

    @property
    def caught_up(self) -> bool:
        return self.stream.caught_up


def summary_of(folder: str | os.PathLike, warmup_steps: int = 2) -> RunSummary:
    """A run folder's whole summary, read in bounded pieces (a CLI table of huge runs stays small in memory)."""
    return SummaryFollower(folder, warmup_steps).refresh(None)
