"""What the server says about runs: one row per run folder, kept up to date by reading only new bytes.

The sidebar polls the runs list every second or so, and a runs folder collects hundreds of runs over time.
Re-reading every metrics.jsonl on every poll (what `ortlab.runner.compare.row_for` does, fine for a one-off CLI
table) would cost a full parse of every run's history per request. `RunIndex` keeps, per run folder, the byte
offset it has read up to and the few facts a row shows (latest step, loss, samples/s, the mix), and on each
request folds in only the lines appended since: a finished run costs a `stat`, a running one the bytes of its
last few steps. The status is read fresh every time (it is small, and `RunDir.status()` is also where a dead
process is noticed).

Nothing here imports torch, tornado or jupyter: the benchmark and the tests drive it directly.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.runner.rundir import DAMAGED, SPEC_MAX_BYTES, TERMINAL, RunDir, read_metrics

# A metrics request reads at most this many bytes (a client that asked from offset 0 on a very long run gets the
# rest on its next request, from the offset returned).
METRICS_CHUNK_BYTES = 8 * 2**20


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class _Follow:
    """What one run's metrics stream has said so far, and where reading stopped."""

    offset: int = 0
    inode: tuple[int, int] | None = None  # (device, inode) of the file read: a replaced file is read afresh
    mtime: float = 0.0
    step: int = 0
    max_steps: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    steady_samples_per_s: float | None = None
    accelerations: dict[str, Any] = field(default_factory=dict)
    verified: bool = False
    spec_max_steps: int | None = None
    spec_read: bool = False

    def fold(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "step":
            if isinstance(record.get("step"), int):
                self.step = max(self.step, record["step"])
            self.loss = _number(record.get("loss"))
            self.samples_per_s = _number(record.get("samples_per_s"))
        elif event == "train_begin":
            steps = record.get("max_steps")
            if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
                self.max_steps = steps
        if event in ("train_begin", "verified", "train_end") and isinstance(record.get("accelerations"), dict):
            self.accelerations = record["accelerations"]
            self.verified = self.verified or event != "train_begin"
        if event == "train_end" and isinstance(record.get("summary"), dict):
            self.steady_samples_per_s = _number(record["summary"].get("steady_samples_per_s"))


class RunIndex:
    """Rows for the runs under `root`, each refreshed from the bytes appended since the last request.

    Thread-safe: the server calls it from its executor threads (disk reads stay off the event loop).
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
        from ortlab.runner import runs

        def created(run: RunDir) -> float:
            try:
                return run.spec_path.stat().st_mtime
            except OSError:
                return 0.0

        return sorted((r.dir for r in runs(self.root)), key=lambda d: (created(d), d.id), reverse=True)

    def rows(self) -> list[dict[str, Any]]:
        dirs = self.run_dirs()
        with self._lock:
            rows = [self._row_locked(d) for d in dirs]
            present = {d.id for d in dirs}
            for gone in [k for k in self._follows if k not in present]:
                del self._follows[gone]  # a removed run folder: forget it (a new one of that name starts afresh)
        return rows

    def row(self, run: RunDir, status: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._lock:
            return self._row_locked(run, status)

    def detail(self, run: RunDir) -> dict[str, Any]:
        """One run's row, plus its status.json, its spec as run (JSON) and result.json (None until completed).

        The spec is read as a record (`stored`): no check against this machine, so no torch, and a run trained
        elsewhere (fp16 on a GPU) still shows. An unreadable spec is reported in `spec_error`, not a 500.
        """
        from ortlab.spec import SpecError

        status = run.status()
        row = self.row(run, status)
        try:
            spec, spec_error = run.spec().model_dump(mode="json"), None
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

    def _row_locked(self, run: RunDir, status: dict[str, Any] | None = None) -> dict[str, Any]:
        status = run.status() if status is None else status
        follow = self._refresh(run)
        state = status.get("state", "unknown")
        ended = state in TERMINAL
        acc = follow.accelerations
        requested = [k for k, v in acc.items() if isinstance(v, dict) and v.get("requested")]
        applied = [k for k, v in acc.items() if isinstance(v, dict) and v.get("applied")]
        # Before the first step is verified (or the run ended), "applied: false" only means "not checked yet".
        not_applied = [k for k in requested if k not in applied] if follow.verified or ended else []
        step = follow.step
        if isinstance(status.get("step"), int) and not isinstance(status.get("step"), bool):
            step = max(step, status["step"])
        max_steps = follow.max_steps or self._spec_max_steps(run, follow)
        samples = follow.steady_samples_per_s if ended and follow.steady_samples_per_s else follow.samples_per_s
        updated = max(_number(status.get("updated")) or 0.0, follow.mtime)
        return {
            "id": run.id,
            "state": state,
            "step": step,
            "max_steps": max_steps,
            "samples_per_s": samples,
            "loss": follow.loss,
            "requested": requested,
            "applied": applied,
            "not_applied": not_applied,
            "verified": follow.verified,
            "paused": bool(status.get("paused")) and state == "running",
            # A damaged folder says why in the same place a failed run does (the sidebar shows `error`).
            "error": status.get("error") if state == "failed" else status.get(DAMAGED) if state == DAMAGED else None,
            "updated": updated,
        }

    def _refresh(self, run: RunDir) -> _Follow:
        follow = self._follows.get(run.id)
        try:
            st = run.metrics_path.stat()
        except FileNotFoundError:
            st = None
        inode = (st.st_dev, st.st_ino) if st else None
        if follow is None or (st is not None and (inode != follow.inode or st.st_size < follow.offset)):
            # First sight, or the file was replaced or cut: read it from the start.
            keep = follow if follow is not None and follow.spec_read else None
            follow = _Follow(inode=inode)
            if keep is not None:
                follow.spec_max_steps, follow.spec_read = keep.spec_max_steps, True
            self._follows[run.id] = follow
        if st is None or st.st_size == follow.offset:
            return follow
        records, follow.offset = read_metrics(run.metrics_path, follow.offset)
        for record in records:
            follow.fold(record)
        follow.mtime = st.st_mtime
        return follow

    @staticmethod
    def _spec_max_steps(run: RunDir, follow: _Follow) -> int | None:
        """`hyper.max_steps` of the run's spec, read once (until training starts it is the only total known)."""
        if not follow.spec_read:
            follow.spec_read = True
            follow.spec_max_steps = None
            try:
                import yaml

                loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
                data = yaml.load(safeio.read_bytes(run.path, "spec.yaml", SPEC_MAX_BYTES), Loader=loader)
                steps = (data.get("hyper") or {}).get("max_steps") if isinstance(data, dict) else None
                if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
                    follow.spec_max_steps = steps
            except (OSError, ValueError, AttributeError, yaml.YAMLError):
                pass
        return follow.spec_max_steps


def metrics_since(run: RunDir, offset: int) -> dict[str, Any]:
    """Complete metrics records after byte `offset`, and the offset to ask from next time.

    Only the bytes after `offset` are read (at most METRICS_CHUNK_BYTES), so polling a running run every second
    costs the size of its newest lines. An offset past the end of the file means the client followed another
    file (the run folder was replaced): ValueError, so that it starts again from 0.
    """
    try:
        size = run.metrics_path.stat().st_size
    except FileNotFoundError:
        size = 0
    if offset > size:
        raise ValueError(
            f"offset {offset} is past the end of the run's metrics ({size} bytes): the run folder was replaced; "
            "read again from offset 0"
        )
    records, new_offset = read_metrics(run.metrics_path, offset, max_bytes=METRICS_CHUNK_BYTES)
    return {"records": records, "offset": new_offset}
