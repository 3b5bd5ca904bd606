"""The cluster side of a Ray Train run: the job's driver, its workers' training loop, and the failure record.

    python -m ortlab.runner.raytrainjob STORAGE_RUN [--resume]      (the job's entrypoint; see `raytrain`)

The driver reads the spec from the storage run folder, starts `target.processes` workers with Ray Train's
`TorchTrainer` and prints the run's records for the local monitor while they train (`raychannel.streamed`).

Ray Train restarts, ortlab resumes. When a worker dies, Ray Train tears the group down and starts a new one (up to
`target.max_failures` times) by itself; ortlab writes no restart loop. What a new group trains from is the run
folder's last complete checkpoint, the same one a stop and resume uses (the run folder is where checkpoints live;
reporting them to Ray Train as well would copy each one a second time). Rank 0 of each group records the attempt
in `ray-workers.jsonl` (with every rank's pid and node) and, for a restart, a `restart` record in the metrics
stream: which workers failed and why (Ray Train's controller writes `ray-failures.jsonl` through a callback), and
the step the group resumes from. Steps trained again after it are not written twice (`StepMetricsCallback`).

This module imports Ray at the top: only the job (and the workers, which unpickle the loop from here) load it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from typing import Any

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2.api.callback import UserCallback

from ortlab import safeio
from ortlab.runfolder.rundir import TERMINAL, RunDir, RunStateError
from ortlab.runfolder.stream import records
from ortlab.runner.raychannel import streamed
from ortlab.spec import RunSpec

WORKERS_FILE = "ray-workers.jsonl"  # one line per rank and attempt: {attempt, rank, pid, node, time}
FAILURES_FILE = "ray-failures.jsonl"  # one line per failure Ray Train saw: {time, workers: {rank: reason}}
MAX_REASON_CHARS = 500


def _append(run: RunDir, name: str, record: dict[str, Any]) -> None:
    """One JSON line appended to a file of the run folder (opened without following a link)."""
    fd = safeio.open_in(run.path, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (safeio.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _last(run: RunDir, name: str) -> dict[str, Any] | None:
    """The file's last record (read in bounded pieces; a bad line is passed over), or None."""
    last = None
    for record in records(run.path, name=name):
        last = record
    return last


class Failures(UserCallback):
    """Ray Train's controller calls this when workers fail: which ranks, and why, go to the run folder, where the
    next group's rank 0 reads them into its `restart` record."""

    def __init__(self, run_path: str):
        self.run_path = run_path

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        why = {
            str(rank): f"{type(e).__name__}: {e}".splitlines()[0][:MAX_REASON_CHARS]
            for rank, e in sorted(worker_exceptions.items())
        }
        _append(RunDir(self.run_path), FAILURES_FILE, {"time": time.time(), "workers": why})


def _agree(resume: bool, attempt: int) -> tuple[bool, int]:
    """Rank 0's decision, on every rank (one small broadcast over the group Ray Train set up)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flags = torch.tensor([int(resume), attempt], dtype=torch.int64, device=device)
    dist.broadcast(flags, src=0)
    return bool(flags[0].item()), int(flags[1].item())


def train_loop(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs (a fresh group after every failure): decide resume-or-start on rank 0,
    agree, train."""
    import ray.train

    from ortlab.train.run import execute

    run = RunDir(config["run"])
    context = ray.train.get_context()
    rank = context.get_world_rank()
    resume, attempt = bool(config["resume"]), 0
    if rank == 0:
        previous = _last(run, WORKERS_FILE)
        attempt = int(previous["attempt"]) + 1 if previous and config["job"] == previous.get("job") else 0
        if attempt:
            resume = _record_restart(run, attempt)
    resume, attempt = _agree(resume, attempt)
    _append(
        run,
        WORKERS_FILE,
        {"job": config["job"], "attempt": attempt, "rank": rank, "pid": os.getpid(), "node": context.get_node_rank()},
    )
    execute(run, resume=resume, progress=False)


def _record_restart(run: RunDir, attempt: int) -> bool:
    """Rank 0 of a restarted group: put the run back to running, write the `restart` record, and say whether there
    is a checkpoint to resume from (none: the group starts over, and steps already recorded are not written again)."""
    from ortlab.train.metrics import JsonLinesSink

    with_checkpoint = run.last_checkpoint()
    try:
        if run.read_status().get("state") == "failed":  # the old rank 0 saw its group break and said so
            run.set_status("pending")
    except RunStateError:
        pass
    failure = _last(run, FAILURES_FILE) or {}
    workers = failure.get("workers") if isinstance(failure.get("workers"), dict) else {}
    step = int(with_checkpoint.name.split("-")[-1]) if with_checkpoint else 0
    sink = JsonLinesSink(run.metrics_path)
    sink(
        {
            "event": "restart",
            "attempt": attempt,
            "failed_workers": sorted(int(k) for k in workers if k.isdigit()),
            "reason": "; ".join(f"rank {r}: {why}" for r, why in workers.items())
            or "a worker of the previous group ended (Ray Train restarted the group)",
            "resumes_from_step": step,
        }
    )
    sink.close()
    return with_checkpoint is not None


def drive(run: RunDir, resume: bool) -> None:
    """Train `run` on `target.processes` Ray Train workers; end its status `failed` if they could not finish."""
    import ray

    spec = RunSpec.from_run(run)
    t = spec.target
    ray.init(logging_level="ERROR")
    per_worker = {"CPU": t.cpus_per_process, **({"GPU": t.gpus_per_process} if t.gpus_per_process else {})}
    trainer = TorchTrainer(
        train_loop,
        # `job`: this driver's own mark, so attempts are counted per job (a resumed run's new job starts at 0).
        train_loop_config={"run": str(run.path), "resume": resume, "job": secrets.token_hex(6)},
        scaling_config=ScalingConfig(
            num_workers=t.processes, use_gpu=bool(t.gpus_per_process), resources_per_worker=per_worker
        ),
        torch_config=TorchConfig(backend="nccl" if t.gpus_per_process else "gloo"),
        run_config=RunConfig(
            name="ray-train",
            storage_path=str(run.path / "ray"),
            failure_config=FailureConfig(max_failures=t.max_failures),
            callbacks=[Failures(str(run.path))],
        ),
    )
    error = None
    try:
        trainer.fit()
    except Exception as e:  # Ray Train gave up: the failures ran out, or the group could not start
        error = f"{type(e).__name__}: {e}".strip().splitlines()[0][:MAX_REASON_CHARS]
    state = run.read_status().get("state")
    if error or state not in TERMINAL:
        failures = list(records(run.path, name=FAILURES_FILE))
        last = failures[-1].get("workers") if failures and isinstance(failures[-1].get("workers"), dict) else {}
        why = "; ".join(f"rank {rank}: {reason}" for rank, reason in last.items()) or error or "no final status"
        message = (
            f"the Ray Train workers failed {len(failures)} time(s), more than target.max_failures "
            f"({t.max_failures}) allows; last: {why}"
            if failures
            else f"the Ray Train run could not finish: {why}"
        )
        if state == "failed":  # rank 0 said why its own process ended; the group's reason says more
            run.update_status(error=message, step=run.last_step())
        elif state not in TERMINAL:  # (a completed or stopped run keeps its end)
            run.set_status("failed", error=message, step=run.last_step())
    if run.read_status().get("state") == "failed":
        raise RuntimeError(run.read_status().get("error", "the run failed"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}")
    p.add_argument("run_dir")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    run = RunDir(a.run_dir)
    return streamed(run, lambda: drive(run, a.resume))


if __name__ == "__main__":
    sys.exit(main())
