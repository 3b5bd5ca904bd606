"""Runs: training in its own process, watched through its run folder.

    run = ortlab.launch(spec)              # returns at once; the kernel stays free
    for record in run.follow(): ...        # the history, then live records until the run ends
    run.stop(); run.resume(); run.wait()
    ortlab.runs(); ortlab.attach(run_id)   # from any process, e.g. a fresh kernel after a restart

Nothing but the run process holds training state: every view reads the run folder (`ortlab.runner.rundir`), so
a kernel restart loses nothing, and several runs can go at once (own folders, own ports, own processes).
Importing this module stays light (no torch): the run process does the heavy imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ortlab.runner.rundir import TERMINAL, RunDir, process_create_time, read_metrics

DEFAULT_ROOT = "ortlab-runs"


def default_root() -> Path:
    """Where runs live unless a spec says otherwise: $ORTLAB_RUNS, else ./ortlab-runs."""
    return Path(os.environ.get("ORTLAB_RUNS", DEFAULT_ROOT))


class RunError(RuntimeError):
    """A run operation that cannot be done in the run's current state (the message says why)."""


class Run:
    """A handle on one run folder. Cheap; any number of handles (in any processes) may watch the same run."""

    def __init__(self, path: str | os.PathLike):
        self.dir = RunDir(path)
        self._process: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        return self.dir.id

    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def state(self) -> str:
        return self.status()["state"]

    def status(self) -> dict[str, Any]:
        if self._process is not None:
            self._process.poll()  # reap our own child so that a dead run is not seen as a zombie
        return self.dir.status()

    def spec(self):
        return self.dir.spec()

    def metrics(self) -> list[dict[str, Any]]:
        return self.dir.metrics()

    def result(self) -> dict[str, Any] | None:
        return self.dir.result()

    def follow(
        self, callback: Callable[[dict], None] | None = None, poll_s: float = 0.5, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every metrics record: those written so far, then new ones as they come, until the run ends.

        Use as an iterator (`for r in run.follow()`), or pass `callback` and exhaust it (`list(...)`).
        """
        offset, deadline = 0, None if timeout is None else time.monotonic() + timeout
        while True:
            # The run writes its last metrics before its final status: once the status says it ended, one more
            # read has every line.
            ended = self.state in TERMINAL
            records, offset = read_metrics(self.dir.metrics_path, offset)
            for record in records:
                if callback is not None:
                    callback(record)
                yield record
            if ended or (deadline is not None and time.monotonic() > deadline):
                return
            if not records:
                time.sleep(poll_s)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Block until the run ends (or `timeout` s); returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status["state"] in TERMINAL:
                if self._process is not None:
                    self._process.wait()
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} is still {status['state']} after {timeout} s")
            time.sleep(poll_s)

    def stop(self, timeout: float = 300.0) -> dict[str, Any]:
        """Graceful stop: the run finishes its current step, saves a checkpoint and exits as `stopped`.

        If it has not stopped within `timeout` seconds, it is terminated (and ends `failed`).
        """
        status = self.status()
        if status["state"] in TERMINAL:
            return status
        self.dir.request_stop()
        try:
            return self.wait(timeout=timeout)
        except TimeoutError:
            pid = status.get("pid")
            if pid:
                _signal_group(pid, signal.SIGTERM)
                time.sleep(5)
                _signal_group(pid, signal.SIGKILL)
            return self.wait(timeout=30)

    def resume(self) -> Run:
        """Continue a stopped (or failed) run from its last checkpoint, in a new run process."""
        status = self.status()
        if status["state"] not in ("stopped", "failed"):
            raise RunError(f"run {self.id} is {status['state']}: only a stopped or failed run can resume")
        if self.dir.last_checkpoint() is None:
            raise RunError(f"run {self.id} has no checkpoint to resume from (it stopped before its first save)")
        self.dir.clear_stop()
        self._process = _start(self.dir, self.spec(), resume=True)
        return self

    def export_onnx(self, **kwargs: Any):
        """Export the finished model to ONNX with a parity check and latency numbers (see ortlab.export)."""
        from ortlab.export import export_onnx

        return export_onnx(self.dir, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs: Any):
        """Publish model, tokenizer, ONNX files and a model card (see ortlab.publish)."""
        from ortlab.publish import push_to_hub

        return push_to_hub(self.dir, repo_id, **kwargs)

    def compare(self, *others: Run) -> list:
        from ortlab.runner.compare import compare

        return compare([self.dir, *[o.dir for o in others]])


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ortlab_path() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


def _start(run: RunDir, spec: Any, resume: bool = False) -> subprocess.Popen:
    python = spec.target.python or sys.executable
    worker = ["-m", "ortlab.runner.worker", str(run.path.resolve()), *(["--resume"] if resume else [])]
    if spec.target.processes > 1:
        cmd = [
            python,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={spec.target.processes}",
            f"--master_port={_free_port()}",
            *worker,
        ]
    else:
        cmd = [python, *worker]
    env = dict(os.environ)
    # The run process imports this ortlab, whichever interpreter runs it (another runtime included).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ortlab_path(), env.get("PYTHONPATH")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    run.log_path.parent.mkdir(exist_ok=True)
    with run.log_path.open("ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        # Its own session: a stop or kill reaches the whole group (torchrun and its workers), and a notebook
        # interrupt (SIGINT to the kernel's group) does not reach the run.
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,
        )
    run.set_status("pending", pid=proc.pid, create_time=process_create_time(proc.pid), launcher=cmd[:3])
    return proc


def launch(spec: Any = None, root: str | os.PathLike | None = None, **overrides: Any) -> Run:
    """Start `spec` (a RunSpec, a dict, or a YAML/JSON path; default: the embedded default) in its own process.

    The spec is validated here (instantly); the model and data checks run in the run process and a problem
    there ends the run `failed` with the message. Returns at once.
    """
    from ortlab.spec import RunSpec

    if spec is None:
        spec = RunSpec()
    elif isinstance(spec, (str, Path)):
        spec = RunSpec.load(spec)
    elif isinstance(spec, dict):
        spec = RunSpec.parse(spec)
    if overrides:
        spec = RunSpec.parse({**spec.model_dump(mode="json"), **overrides})
    run_dir = RunDir.create(root or spec.output_dir, spec)
    run = Run(run_dir.path)
    run._process = _start(run_dir, spec)
    return run


def runs(root: str | os.PathLike | None = None) -> list[Run]:
    """All runs under `root` (default ./ortlab-runs), oldest first."""
    base = Path(root) if root else default_root()
    if not base.is_dir():
        return []
    found = [Run(p) for p in base.iterdir() if (p / "status.json").exists()]
    return sorted(found, key=lambda r: (r.path.stat().st_ctime, r.id))


def attach(run_id: str | os.PathLike, root: str | os.PathLike | None = None) -> Run:
    """A handle on an existing run, by id (folder name under `root`) or by path, e.g. after a kernel restart."""
    candidate = Path(run_id)
    if not (candidate / "status.json").exists():
        candidate = (Path(root) if root else default_root()) / str(run_id)
    if not (candidate / "status.json").exists():
        known = ", ".join(r.id for r in runs(root)) or "none"
        raise RunError(f"no run {str(run_id)!r} (runs under {root or default_root()}: {known})")
    return Run(candidate)
