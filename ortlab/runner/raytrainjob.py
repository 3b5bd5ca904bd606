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
import contextlib
import os
import secrets
import shutil
import sys
import time
from typing import Any

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2.api.callback import UserCallback

from ortlab import safeio
from ortlab.runfolder.rundir import TERMINAL, RunDir, RunStateError
from ortlab.runfolder.stream import records
from ortlab.runner.objstore import UPLOADED, Store, StoredRun, is_uri
from ortlab.runner.objsync import LIVE_S, Follower, Mirror, jobs_dir, node_folder
from ortlab.runner.raychannel import streamed
from ortlab.spec import RunSpec

WORKERS_FILE = "ray-workers.jsonl"  # one line per rank and attempt: {attempt, rank, pid, node, time}
FAILURES_FILE = "ray-failures.jsonl"  # one line per failure Ray Train saw: {time, workers: {rank: reason}}
MAX_REASON_CHARS = 500


def _append(where: RunDir | Store, name: str, lines: list[dict[str, Any]]) -> None:
    """JSON lines appended to a file of the run folder (opened without following a link), or of the stored run."""
    if isinstance(where, Store):
        where.append_records(name, lines)
        return
    fd = safeio.open_in(where.path, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, "".join(safeio.dumps(line) + "\n" for line in lines).encode())
    finally:
        os.close(fd)


def _all(where: RunDir | Store, name: str) -> list[dict[str, Any]]:
    """The file's records (read in bounded pieces; a bad line is passed over)."""
    return where.records(name) if isinstance(where, Store) else list(records(where.path, name=name))


def _last(where: RunDir | Store, name: str) -> dict[str, Any] | None:
    found = _all(where, name)
    return found[-1] if found else None


class Failures(UserCallback):
    """Ray Train's controller calls this when workers fail: which ranks, and why, go to the run folder, where the
    next group's rank 0 reads them into its `restart` record."""

    def __init__(self, where: str):
        self.where = where  # the run folder's path, or the stored run's URI

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        why = {
            str(rank): f"{type(e).__name__}: {e}".splitlines()[0][:MAX_REASON_CHARS]
            for rank, e in sorted(worker_exceptions.items())
        }
        _append(_place(self.where), FAILURES_FILE, [{"time": time.time(), "workers": why}])


def _place(where: str) -> RunDir | Store:
    """Where the Ray Train records of a run are kept: its run folder, or its stored run in an object store."""
    return Store(where) if is_uri(where) else RunDir(where)


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
    agree, train.

    With a shared storage folder every rank trains in it. With an object store each node has its own copy (the
    node's first rank pulls it from the store; see `objsync.Mirror`), rank 0 keeps the store in step with its
    stream and status, and every node uploads its part of each checkpoint (`UploadCheckpoints`)."""
    import ray.train
    import torch.distributed as dist

    from ortlab.lifecycle.execute import execute

    context = ray.train.get_context()
    rank, node = context.get_world_rank(), ray.get_runtime_context().get_node_id()
    # Each node's first rank fetches and uploads that node's copy. Found by node ID: Ray Train's local rank groups
    # workers by IP address, and several nodes on one machine share one.
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    leader = nodes.index(node) == rank
    place = _place(config["run"])
    resume, attempt = bool(config["resume"]), 0
    if rank == 0:
        previous = _last(place, WORKERS_FILE)
        attempt = int(previous["attempt"]) + 1 if previous and config["job"] == previous.get("job") else 0
    resume, attempt = _agree(resume, attempt)
    stored = StoredRun(place) if isinstance(place, Store) else None
    if stored is not None:
        run = RunDir(jobs_dir() / f"{config['job']}-{node[:12]}" / stored.id)  # (one per node, for every group)
        mirror = Mirror(stored, run, checkpoints=False, metrics_every=LIVE_S)
        if leader:
            mirror.pull(resume or attempt > 0, controls=rank == 0)
        dist.barrier()
    else:
        run = place
    if rank == 0 and attempt:
        resume = _record_restart(run, place, attempt)
    resume, attempt = _agree(resume, attempt)
    who = {"job": config["job"], "attempt": attempt, "rank": rank, "pid": os.getpid(), "node": context.get_node_rank()}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, who)
    if rank == 0:  # one writer (an object cannot be appended to by several)
        _append(place, WORKERS_FILE, everyone)
    if stored is None:
        execute(run, resume=resume, progress=False)
        return
    upload = _upload_checkpoints(stored, run, rank, leader)
    if rank == 0:
        with mirror.syncing():
            execute(run, resume=resume, progress=False, callbacks=[upload])
    else:
        execute(run, resume=resume, progress=False, callbacks=[upload])
    dist.barrier()
    if leader:  # everything is in the store
        shutil.rmtree(run.path.parent, ignore_errors=True)


def _upload_checkpoints(stored: StoredRun, run: RunDir, rank: int, leader: bool) -> Any:
    """A TrainerCallback for object storage: once every rank has written its part of a checkpoint (ZeRO shards
    are per rank, and each node has only its own ranks' files), each node uploads what it holds, and rank 0 then
    marks the stored checkpoint whole."""
    import torch.distributed as dist
    from transformers import TrainerCallback

    class UploadCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            rel = f"checkpoints/checkpoint-{state.global_step}"
            dist.barrier()
            if leader and (run.path / rel).is_dir():
                stored.store.upload(run.path, rel)
            dist.barrier()
            if rank == 0:
                stored.store.write_bytes(f"{rel}/{UPLOADED}", b"")

    return UploadCheckpoints()


def _record_restart(run: RunDir, place: RunDir | Store, attempt: int) -> bool:
    """Rank 0 of a restarted group: put the run back to running, write the `restart` record, and say whether there
    is a checkpoint to resume from (none: the group starts over, and steps already recorded are not written again)."""
    from ortlab.train.metrics import JsonLinesSink

    with_checkpoint = run.last_checkpoint()
    try:
        if run.read_status().get("state") == "failed":  # the old rank 0 saw its group break and said so
            run.set_status("pending")
    except RunStateError:
        pass
    failure = _last(place, FAILURES_FILE) or {}
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


def drive(run: RunDir, resume: bool, stored: StoredRun | None = None) -> None:
    """Train `run` on `target.processes` Ray Train workers; end its status `failed` if they could not finish.

    `stored`: the run's stored copy when the storage is an object store; `run` is then this node's copy, which
    follows the store while the workers train (`objsync.Follower`), and the end this driver decides is pushed
    back to the store."""
    import ray

    spec = RunSpec.from_run(run)
    t = spec.target
    place = stored.store if stored is not None else run
    where = stored.path if stored is not None else str(run.path)
    ray.init(logging_level="ERROR")
    per_worker = {"CPU": t.cpus_per_process, **({"GPU": t.gpus_per_process} if t.gpus_per_process else {})}
    trainer = TorchTrainer(
        train_loop,
        # `job`: this driver's own mark, so attempts are counted per job (a resumed run's new job starts at 0).
        train_loop_config={"run": where, "resume": resume, "job": secrets.token_hex(6)},
        scaling_config=ScalingConfig(
            num_workers=t.processes, use_gpu=bool(t.gpus_per_process), resources_per_worker=per_worker
        ),
        torch_config=TorchConfig(backend="nccl" if t.gpus_per_process else "gloo"),
        run_config=RunConfig(
            name="ray-train",
            storage_path=str(run.path / "ray"),  # (Ray Train's own records: ortlab reports no checkpoints to it)
            failure_config=FailureConfig(max_failures=t.max_failures),
            callbacks=[Failures(where)],
        ),
    )
    error = None
    with Follower(stored, run).following() if stored is not None else contextlib.nullcontext():
        try:
            trainer.fit()
        except Exception as e:  # Ray Train gave up: the failures ran out, or the group could not start
            error = f"{type(e).__name__}: {e}".strip().splitlines()[0][:MAX_REASON_CHARS]
    state = run.read_status().get("state")
    if error or state not in TERMINAL:
        failures = _all(place, FAILURES_FILE)
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
        if stored is not None:
            stored.write_status(run.read_status())
    if run.read_status().get("state") == "failed":
        raise RuntimeError(run.read_status().get("error", "the run failed"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}")
    p.add_argument("run_dir", help="the storage run folder: a shared folder's path, or an object store URI")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    if not is_uri(a.run_dir):
        run = RunDir(a.run_dir)
        return streamed(run, lambda: drive(run, a.resume))
    stored = StoredRun(Store(a.run_dir))
    run = node_folder(stored)
    Mirror(stored, run).pull(resume=False)  # the spec and status: the workers pull what they train from
    code = streamed(run, lambda: drive(run, a.resume, stored))
    if code == 0:
        shutil.rmtree(run.path.parent, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
