"""The run directory: everything a run is, on disk, readable by any process at any time.

    spec.yaml          the RunSpec, as run
    status.json        pending | running | completed | failed | stopped, with pid, step, error and traceback
    metrics.jsonl      append-only metrics stream (one JSON object per line; see ortlab.train.metrics)
    logs/run.log       the run process's stdout and stderr
    checkpoints/       Trainer checkpoints (written on stop, and every hyper.save_steps)
    model/             the final model and tokenizer (only once completed)
    result.json        eval before/after, throughput summary, what applied (only once completed)
    control/stop       present = a graceful stop was asked for

status.json and result.json are replaced atomically, so a reader never sees half of one. A run whose process
died without saying so (kill -9, out of memory, machine reboot) is recognised by its dead pid and marked
failed the first time anyone reads its status: no run stays "running" forever.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

STATES = ("pending", "running", "completed", "failed", "stopped")
TERMINAL = frozenset({"completed", "failed", "stopped"})


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


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


def read_metrics(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines from byte `offset` on, and the offset after the last complete line.

    A line still being written (no newline yet), or cut short by a killed process, is not returned; a reader
    following the file picks it up on its next call once it is complete.
    """
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    records, consumed = [], 0
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break
        consumed += len(raw)
        try:
            records.append(json.loads(raw))
        except json.JSONDecodeError:
            continue  # a torn line in the middle (a killed writer, then a resume): skip it, keep the rest
    return records, offset + consumed


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
        """A new, uniquely named run folder holding the spec and a `pending` status."""
        name = name or spec.name or f"{spec.task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        base = Path(root) / name
        path, i = base, 1
        while True:
            try:
                path.mkdir(parents=True)
                break
            except FileExistsError:
                i += 1
                path = base.with_name(f"{base.name}-{i}")
        run = cls(path)
        (path / "logs").mkdir()
        (path / "control").mkdir()
        run.spec_path.write_text(spec.to_yaml())
        run.set_status("pending")
        return run

    def spec(self) -> Any:
        from ortlab.spec import RunSpec

        return RunSpec.load(self.spec_path)

    # --- status --------------------------------------------------------------------------------------------

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_path.read_text())
        except FileNotFoundError:
            return {"state": "missing"}
        except json.JSONDecodeError:
            return {"state": "unknown"}

    def set_status(self, state: str, **fields: Any) -> dict[str, Any]:
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        current = self.read_status() if self.status_path.exists() else {}
        identity = ("pid", "create_time", "started", "launcher", "python", "world_size", "worker_pid")
        keep = {k: v for k, v in current.items() if k in identity}
        status = {**keep, **fields, "state": state, "updated": time.time()}
        if state in ("completed", "failed", "stopped"):
            status.setdefault("ended", time.time())
        write_json(self.status_path, status)
        return status

    def status(self) -> dict[str, Any]:
        """The status, after checking that a pending/running run still has a live process."""
        status = self.read_status()
        live_state = status.get("state") in ("pending", "running") and status.get("pid")
        if live_state and not process_alive(status["pid"], status.get("create_time")):
            last = self.last_step()
            status = self.set_status(
                "failed",
                error=f"the run process (pid {status['pid']}) ended without reporting a result "
                f"(killed, out of memory, or the machine restarted); last step written: {last}",
                step=last,
            )
        return status

    @property
    def state(self) -> str:
        return self.status().get("state", "unknown")

    # --- contents --------------------------------------------------------------------------------------------

    def metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.metrics_path)[0]

    def last_step(self) -> int:
        steps = [r.get("step", 0) for r in self.metrics() if r.get("event") == "step"]
        return max(steps, default=0)

    def result(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.result_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def last_checkpoint(self) -> Path | None:
        if not self.checkpoints.exists():
            return None
        found = [p for p in self.checkpoints.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
        complete = [p for p in found if (p / "trainer_state.json").exists()]
        return max(complete, key=lambda p: int(p.name.split("-")[-1]), default=None)

    def request_stop(self) -> None:
        self.stop_path.parent.mkdir(exist_ok=True)
        self.stop_path.write_text(str(time.time()))

    def stop_requested(self) -> bool:
        return self.stop_path.exists()

    def clear_stop(self) -> None:
        self.stop_path.unlink(missing_ok=True)
