"""What the server says about runs: one row per run folder, kept up to date by reading only new bytes.

The sidebar polls the runs list every second or so, and a runs folder collects hundreds of runs over time.
Re-reading every metrics.jsonl on every poll (what `ortlab.runfolder.compare.row_for` does, fine for a one-off CLI
table) would cost a full parse of every run's history per request. `RunIndex` keeps, per run folder, a
`SummaryFollower` (the byte offset read up to and the run's `RunSummary`), and on each request folds in only the
lines appended since: a finished run costs a `stat`, a running one the bytes of its last few steps. The status is
read fresh every time (it is small, and `RunDir.status()` is also where a dead process is noticed).

A run folder can hold anything, a metrics file of hundreds of MiB included (one of 171 MiB, read whole under one
lock, took 10 s and 1.6 GB while every other request waited). So one request reads at most ROWS_BUDGET_BYTES of
metrics over all runs (a run with more left says `catching_up`, and the next polls read on), the reading holds only
that run's own lock, and a request that finds a run being read by another one answers with that run's last view
rather than waiting. Memory is one read piece per reader, never a file.

Nothing here imports torch, tornado or jupyter: the benchmark and the tests drive it directly.
"""

from __future__ import annotations

import math
import os
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.runfolder import events
from ortlab.runfolder.downsample import MIN_POINTS, keep_indices
from ortlab.runfolder.records import SIDEBAR, drawn
from ortlab.runfolder.rundir import DAMAGED, SPEC_MAX_BYTES, TERMINAL, RunDir
from ortlab.runfolder.stream import MetricsStream, SummaryFollower
from ortlab.runner import runs
from ortlab.spec import RunSpec, SpecError

# A metrics request reads at most this many bytes (a client that asked from offset 0 on a very long run gets the
# rest on its next request, from the offset returned).
METRICS_CHUNK_BYTES = 8 * 2**20
# One runs-list request reads at most this many bytes of metrics over all runs (new runs, or a huge history).
ROWS_BUDGET_BYTES = 16 * 2**20
# Step records one metrics answer carries at most: past this, the page's steps are downsampled (min and max per
# bucket of the numbers a chart draws, `ortlab.runfolder.downsample`). A 100,000-step run's first page would
# otherwise be ~40,000 records (8 MiB of JSON) for a sparkline 120 pixels wide. A client asks for fewer or more
# with `max_points`, within these bounds; every record is still in the run folder.
DEFAULT_MAX_POINTS = 2000
MAX_POINTS_LIMIT = 20_000
MIN_POINTS_LIMIT = MIN_POINTS
# The numbers whose extremes survive downsampling: the step fields the sidebar draws, as the record schema says.
DRAWN = drawn(events.STEP, SIDEBAR)


def _number(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float (a hand-made file): not a number to use
        return None


@dataclass
class _Follow:
    """One run's follower, its lock (held only while reading that run), and the view of its last refresh."""

    follower: SummaryFollower
    lock: threading.Lock = field(default_factory=threading.Lock)
    view: dict[str, Any] = field(default_factory=dict)
    caught_up: bool = False
    read_once: bool = False
    mtime: float = 0.0
    spec_max_steps: int | None = None
    spec_read: bool = False


class RunIndex:
    """Rows for the runs under `root`, each refreshed from the bytes appended since the last request.

    Thread-safe: the server calls it from its executor threads (disk reads stay off the event loop). The index's
    own lock guards only its table of runs; reading a run's metrics holds that run's lock, never the index's.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._follows: dict[str, _Follow] = {}
        self._lock = threading.Lock()

    def run_dirs(self) -> list[RunDir]:
        """Every run folder under the root (the ones `ortlab.runs` lists), newest first.

        Ordered by when the run was created (its spec.yaml is written once, then never again), not by the
        folder's own ctime, which moves each time status.json is replaced: the sidebar's rows stay put.
        """

        def created(run: RunDir) -> float:
            try:
                return run.spec_path.stat().st_mtime
            except OSError:
                return 0.0

        return sorted((r.dir for r in runs(self.root)), key=lambda d: (created(d), d.id), reverse=True)

    def rows(self) -> list[dict[str, Any]]:
        dirs = self.run_dirs()
        with self._lock:
            present = {d.id for d in dirs}
            for gone in [k for k in self._follows if k not in present]:
                del self._follows[gone]  # a removed run folder: forget it (a new one of that name starts afresh)
        budget = [ROWS_BUDGET_BYTES]  # shared by the runs of this one request
        return [self._row(d, None, budget) for d in dirs]

    def row(self, run: RunDir, status: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._row(run, status, [ROWS_BUDGET_BYTES])

    def detail(self, run: RunDir) -> dict[str, Any]:
        """One run's row, plus its status.json, its spec as run (JSON) and result.json (None until completed).

        The spec is read as a record (`stored`): no check against this machine, so no torch, and a run trained
        elsewhere (fp16 on a GPU) still shows. An unreadable spec is reported in `spec_error`, not a 500.
        """

        status = run.status()
        row = self.row(run, status)
        try:
            spec, spec_error = RunSpec.from_run(run).model_dump(mode="json"), None
        except (SpecError, OSError, ValueError) as e:
            spec, spec_error = None, str(e)
        result, result_error = run.read_result()
        return {
            **row,
            "status": status,
            "spec": spec,
            "spec_error": spec_error,
            "result": result,
            "result_error": result_error,
        }

    def _follow(self, run: RunDir) -> _Follow:
        with self._lock:
            follow = self._follows.get(run.id)
            if follow is None:
                follower = SummaryFollower(run.path)
                follow = self._follows[run.id] = _Follow(follower, view=follower.summary.view())
            return follow

    def _row(self, run: RunDir, status: dict[str, Any] | None, budget: list[int]) -> dict[str, Any]:
        status = run.status() if status is None else status
        follow = self._follow(run)
        self._refresh(follow, budget)
        view = follow.view
        state = status.get("state", "unknown")
        ended = state in TERMINAL
        requested, applied = view["requested"], view["applied"]
        # Before the first step is verified (or the run ended), "applied: false" only means "not checked yet".
        not_applied = [k for k in requested if k not in applied] if view["verified"] or ended else []
        step = view["step"]
        if isinstance(status.get("step"), int) and not isinstance(status.get("step"), bool):
            step = max(step, status["step"])
        max_steps = view["max_steps"] or self._spec_max_steps(run, follow)
        steady = view["steady_samples_per_s"]
        samples = steady if ended and steady else view["samples_per_s"]
        updated = max(_number(status.get("updated")) or 0.0, follow.mtime)
        return {
            "id": run.id,
            "state": state,
            "step": step,
            "max_steps": max_steps,
            "samples_per_s": samples,
            "loss": view["loss"],
            "requested": requested,
            "applied": applied,
            "not_applied": not_applied,
            "verified": view["verified"],
            "paused": bool(status.get("paused")) and state == "running",
            # A damaged folder says why in the same place a failed run does (the sidebar shows `error`).
            "error": status.get("error") if state == "failed" else status.get(DAMAGED) if state == DAMAGED else None,
            "updated": updated,
            "catching_up": not follow.caught_up,  # more of its metrics is still to be read (the next polls read on)
            "skipped_lines": view["skipped"],  # lines of its metrics that could not be read (see MetricsStream)
            "world_size": view["world_size"],  # training processes (Ray Train workers on a cluster)
            "restarts": view["restarts"],  # worker groups restarted after a failure
        }

    @staticmethod
    def _refresh(follow: _Follow, budget: list[int]) -> None:
        """Fold in the run's new lines, within what is left of this request's budget. A run that another request
        is reading now is not waited for: its last view answers."""
        if budget[0] <= 0 and follow.read_once:
            return  # this request has read its share: the next poll reads on
        if not follow.lock.acquire(blocking=False):
            return
        try:
            stream = follow.follower.stream
            before = stream.offset
            summary = follow.follower.refresh(max(budget[0], 1))
            budget[0] -= stream.offset - before if stream.offset >= before else stream.offset
            follow.view, follow.caught_up, follow.mtime = summary.view(), stream.caught_up, stream.mtime
            follow.read_once = True
        finally:
            follow.lock.release()

    @staticmethod
    def _spec_max_steps(run: RunDir, follow: _Follow) -> int | None:
        """`hyper.max_steps` of the run's spec, read once (until training starts it is the only total known)."""
        if not follow.spec_read:
            follow.spec_read = True
            follow.spec_max_steps = None
            try:
                import yaml

                from ortlab import safeyaml

                data = safeyaml.load(safeio.read_bytes(run.path, "spec.yaml", SPEC_MAX_BYTES))
                steps = (data.get("hyper") or {}).get("max_steps") if isinstance(data, dict) else None
                if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
                    follow.spec_max_steps = steps
            except (OSError, ValueError, AttributeError, yaml.YAMLError):
                pass
        return follow.spec_max_steps


def parse_max_points(raw: str | None) -> int:
    """`max_points` from a request: an integer within [MIN_POINTS_LIMIT, MAX_POINTS_LIMIT], DEFAULT_MAX_POINTS when
    absent. ValueError says what is accepted (the route answers it as a 400)."""
    if raw is None:
        return DEFAULT_MAX_POINTS
    value = safeio.ascii_int(raw)
    if value is None or not MIN_POINTS_LIMIT <= value <= MAX_POINTS_LIMIT:
        raise ValueError(
            f"max_points must be an integer from {MIN_POINTS_LIMIT} to {MAX_POINTS_LIMIT} (step records per answer; "
            f"default {DEFAULT_MAX_POINTS}), got {raw[:40]!r}"
        )
    return value


def _column(records: list[dict[str, Any]], steps: list[int], name: str) -> array:
    """One drawn number of the step records as floats, NaN where it is missing or not a number (NaN is never a
    bucket's extreme, as None is not), so that `keep_indices` finds the extremes of finite buckets in C."""
    out = array("d")
    append = out.append
    for i in steps:
        value = records[i].get(name)
        if type(value) is not float:
            value = _number(value)
            if value is None or value - value != 0.0:
                value = math.nan
        append(value)
    return out


def thin_steps(records: list[dict[str, Any]], max_points: int) -> tuple[list[dict[str, Any]], int]:
    """`records` with at most `max_points` step records (min and max of each DRAWN number per bucket, the first and
    the last step); every other record (eval, train_begin, ...) is kept. Returns them and the steps left out."""
    steps = [i for i, r in enumerate(records) if r.get("event") == events.STEP]
    if len(steps) <= max_points:
        return records, 0
    keep = keep_indices([_column(records, steps, name) for name in DRAWN], max_points)
    kept = {steps[j] for j in keep}
    dropped = set(steps) - kept
    return [r for i, r in enumerate(records) if i not in dropped], len(dropped)


def metrics_since(run: RunDir, offset: int, max_points: int = DEFAULT_MAX_POINTS) -> dict[str, Any]:
    """Complete metrics records after byte `offset`, and the offset to ask from next time.

    Only the bytes after `offset` are read (at most METRICS_CHUNK_BYTES, plus one line), so polling a running run
    every second costs the size of its newest lines. An offset past the end of the file means the client followed
    another file (the run folder was replaced): ValueError, so that it starts again from 0. Lines that could not be
    read (too long, not JSON) are passed over and listed in `skipped` (offset, length, why). At most `max_points`
    step records come back (`thin_steps`); when some were left out, `downsampled` says how many were read and sent.
    """

    def past_end() -> None:
        raise ValueError(
            f"offset {offset} is past the end of the run's metrics ({stream.size} bytes): the run folder was "
            "replaced; read again from offset 0"
        )

    stream = MetricsStream(run.path, offset, on_restart=past_end)
    records = stream.read(METRICS_CHUNK_BYTES)
    if offset > stream.size:  # no file (any more), or one that cannot be read
        past_end()
    sent, dropped = thin_steps(records, max_points)
    answer: dict[str, Any] = {"records": sent, "offset": stream.offset}
    if dropped:
        steps = sum(1 for r in sent if r.get("event") == events.STEP)
        answer["downsampled"] = {"steps_read": steps + dropped, "steps_sent": steps}
    if stream.problem:
        answer["problem"] = stream.problem
    if stream.skips:
        answer["skipped"] = [s.to_dict() for s in stream.skips]
    return answer
