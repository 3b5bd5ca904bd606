"""Job side: a Ray Train run: the job's driver, its workers' training loop, and the failure record.

    python -m ortlab.job raytrain RUN_PLACE [--resume]      (the job's entrypoint; see `ortlab.runner.raytrainjob`)

The driver reads the spec from the storage run folder, starts `target.processes` workers with Ray Train's
`TorchTrainer` and prints the run's records for the local monitor while they train (`ortlab.job.channel.streamed`).

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

import contextlib
import os
import re
import secrets
import shutil
import time
from typing import Any

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2.api.callback import UserCallback

from ortlab.job.channel import streamed
from ortlab.job.mirror import Follower, Mirror, jobs_dir, node_folder
from ortlab.job.raygroup import BoundTorchConfig
from ortlab.lifecycle.execute import execute
from ortlab.runfolder import events
from ortlab.runfolder.place import RunPlace, folder_here, place_at
from ortlab.runfolder.rundir import TERMINAL, RunDir, RunStateError, checkpoint_step
from ortlab.safeio import ascii_int
from ortlab.spec import RunSpec
from ortlab.wire import LIVE_S

# One line per rank and attempt: {job, attempt, rank, pid, node, started (the process's start), entered (the loop's),
# time (the group's set-up done: every rank agreed and has its copy)}; rank 0's also has the step it starts from.
WORKERS_FILE = "ray-workers.jsonl"
FAILURES_FILE = "ray-failures.jsonl"  # one line per failure Ray Train saw: {time, workers: {rank: reason}}
MAX_REASON_CHARS = 500


def _last(place: RunPlace, name: str) -> dict[str, Any] | None:
    """The last record of a JSON-lines file of the run place (read in bounded pieces; a bad line passed over)."""
    last = None
    for last in place.records(name):  # noqa: B007 (the last one is wanted)
        pass
    return last


class Failures(UserCallback):
    """Ray Train's controller calls this when workers fail: which ranks, and why, go to the run folder, where the
    next group's rank 0 reads them into its `restart` record."""

    def __init__(self, where: str, job: str):
        self.where = where  # the run folder's path, or the stored run's URI
        self.job = job  # this driver's mark: a resumed run's earlier jobs' failures are not this job's

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        why = {
            str(rank): f"{type(e).__name__}: {e}".splitlines()[0][:MAX_REASON_CHARS]
            for rank, e in sorted(worker_exceptions.items())
        }
        record = {"time": time.time(), "job": self.job, "workers": why}
        place_at(self.where).append_records(FAILURES_FILE, [record])


def _agree(*flags: int) -> tuple[int, ...]:
    """Rank 0's decisions (small integers), on every rank (one small broadcast over the group Ray Train set up)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    values = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=device)
    dist.broadcast(values, src=0)
    return tuple(int(v) for v in values.tolist())


# What changes between two runs of the same error: a pid, a port, an address, a hex id, a time. Compared without
# them (`failure_signature`), a worker that dies with "pid=4242 ... 127.0.0.1:40123" each time is the same failure.
_VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"), "<time>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{8,}\b"), "<hex>"),  # object, node, actor and job ids
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\]"), "<address>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),  # pids, ports, durations, ranks' numbers
]


def failure_signature(reason: Any) -> str:
    """A failure's reason with what differs from one run of the same error to the next made neutral: a reason
    that carries a pid or a port was never "the same" twice, and a deterministic error was restarted
    target.max_failures times. (Numbers in the message go too: two errors that differ only in them are one.)"""
    text = str(reason)
    for pattern, neutral in _VOLATILE:
        text = pattern.sub(neutral, text)
    return text


def _signatures(failure: dict[str, Any]) -> dict[str, str] | None:
    workers = failure.get("workers")
    if not isinstance(workers, dict) or not workers:
        return None
    return {str(rank): failure_signature(reason) for rank, reason in workers.items()}


def _same_failure_without_a_step(place: RunPlace, run: RunDir, job: str, attempt: int) -> str | None:
    """Why a restarted group should not train again, or None: this job's last two groups failed with the same
    reasons (pids, ports, addresses, ids and times aside: `failure_signature`) and trained no step between them (a
    missing model, a bad spec: a deterministic error that every restart repeats, up to target.max_failures times,
    about half a minute each)."""
    if attempt < 2:
        return None
    failures = [f for f in place.records(FAILURES_FILE) if f.get("job") == job]
    starts = {
        w.get("attempt"): w.get("step")
        for w in place.records(WORKERS_FILE)
        if w.get("job") == job and w.get("rank") == 0
    }
    last = _signatures(failures[-1]) if len(failures) >= 2 else None
    if last is None or last != _signatures(failures[-2]):
        return None
    if starts.get(attempt - 2) != run.last_step():  # (steps only grow: none since two groups ago)
        return None
    why = "; ".join(f"rank {r}: {reason}" for r, reason in (failures[-1].get("workers") or {}).items())
    return (
        f"the Ray Train workers failed twice in a row with the same error and trained no step in between, so they "
        f"are not restarted again (target.max_failures would allow more; a restart repeats a deterministic error): "
        f"{why}"
    )


def train_loop(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs (a fresh group after every failure): decide resume-or-start on rank 0,
    agree, train.

    With a shared storage folder every rank trains in it. With an object store each node has its own copy (the
    node's first rank pulls it from the store; see `ortlab.job.mirror.Mirror`), rank 0 keeps the store in step with its
    stream and status, and every node uploads its part of each checkpoint (`UploadCheckpoints`)."""
    entered = time.time()
    import psutil
    import ray.train
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, node = context.get_world_rank(), ray.get_runtime_context().get_node_id()
    # Each node's first rank fetches and uploads that node's copy. Found by node ID: Ray Train's local rank groups
    # workers by IP address, and several nodes on one machine share one.
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    leader = nodes.index(node) == rank
    place = place_at(config["run"])
    resume, attempt = bool(config["resume"]), 0
    if rank == 0:
        previous = _last(place, WORKERS_FILE)
        attempt = int(previous["attempt"]) + 1 if previous and config["job"] == previous.get("job") else 0
    wanted, attempt = _agree(resume, attempt)
    resume = bool(wanted)
    folder = folder_here(place)
    if folder is None:  # no folder to open here: each node trains in its own copy, kept in step with the place
        run = RunDir(jobs_dir() / f"{config['job']}-{node[:12]}" / place.id)  # (one per node, for every group)
        mirror = Mirror(place, run, checkpoints=False, metrics_every=LIVE_S)
        if leader:
            mirror.pull(resume or attempt > 0, controls=rank == 0)
        dist.barrier()
    else:
        run = folder
    give_up = None
    if rank == 0 and attempt:
        give_up = _same_failure_without_a_step(place, run, config["job"], attempt)
        if give_up is None:
            resume = _record_restart(run, place, attempt)
        else:
            _end_failed(run, give_up)
            if folder is None:
                mirror.push_small(("status.json",))
    wanted, attempt, stop = _agree(resume, attempt, give_up is not None)
    resume = bool(wanted)
    if stop:  # every rank returns: the group ends without an error, and the driver reads the run's end
        return
    who = {"job": config["job"], "attempt": attempt, "rank": rank, "pid": os.getpid(), "node": context.get_node_rank()}
    who.update(started=psutil.Process().create_time(), entered=entered, time=time.time())
    if rank == 0:  # where this group starts: a later group that finds no step since knows it made none
        who["step"] = run.last_step()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, who)
    if rank == 0:  # one writer (an object cannot be appended to by several)
        place.append_records(WORKERS_FILE, everyone)
    if folder is not None:
        execute(run, resume=resume, progress=False)
        return
    upload = _upload_checkpoints(place, run, rank, leader)
    if rank == 0:
        with mirror.syncing():
            execute(run, resume=resume, progress=False, callbacks=[upload])
    else:
        execute(run, resume=resume, progress=False, callbacks=[upload])
    dist.barrier()
    if leader:  # everything is in the store
        shutil.rmtree(run.path.parent, ignore_errors=True)


def _upload_checkpoints(place: RunPlace, run: RunDir, rank: int, leader: bool) -> Any:
    """A TrainerCallback for nodes that train in copies of the run place: once every rank has written its part of a
    checkpoint (ZeRO shards are per rank, and each node has only its own ranks' files), each node pushes what it
    holds, and rank 0 then marks the place's checkpoint whole."""
    import torch.distributed as dist
    from transformers import TrainerCallback

    class UploadCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            rel = f"checkpoints/checkpoint-{state.global_step}"
            dist.barrier()
            if leader and (run.path / rel).is_dir():
                place.put_folder(run.path, rel)
            dist.barrier()
            if rank == 0:
                place.mark_whole(rel)

    return UploadCheckpoints()


def _end_failed(run: RunDir, error: str) -> None:
    """The run ends `failed` with `error` (it may already be `failed`: the old rank 0 saw its group break)."""
    try:
        run.set_status("failed", error=error, step=run.last_step())
    except RunStateError:
        run.update_status(error=error, step=run.last_step())


def _record_restart(run: RunDir, place: RunPlace, attempt: int) -> bool:
    """Rank 0 of a restarted group: put the run back to running, write the `restart` record, and say whether there
    is a checkpoint to resume from (none: the group starts over, and steps already recorded are not written again)."""
    from ortlab.train.metricswriter import JsonLinesSink

    with_checkpoint = run.last_checkpoint()
    try:
        if run.read_status().get("state") == "failed":  # the old rank 0 saw its group break and said so
            run.set_status("pending")
    except RunStateError:
        pass
    failure = _last(place, FAILURES_FILE) or {}
    workers = failure.get("workers") if isinstance(failure.get("workers"), dict) else {}
    step = (checkpoint_step(with_checkpoint.name) or 0) if with_checkpoint else 0
    sink = JsonLinesSink(run.metrics_path)
    sink(
        {
            "event": events.RESTART,
            "attempt": attempt,
            "failed_workers": sorted(r for k in workers if (r := ascii_int(k)) is not None),
            "reason": "; ".join(f"rank {r}: {why}" for r, why in workers.items())
            or "a worker of the previous group ended (Ray Train restarted the group)",
            "resumes_from_step": step,
        }
    )
    sink.close()
    return with_checkpoint is not None


def drive(run: RunDir, resume: bool, place: RunPlace | None = None) -> None:
    """Train `run` on `target.processes` Ray Train workers; end its status `failed` if they could not finish.

    `place`: the run's place when `run` is not it but this node's copy (a place with no folder to open here: an
    object store), which follows the place while the workers train (`ortlab.job.mirror.Follower`), and the end this
    driver decides is pushed back to the place."""
    import ray

    spec = RunSpec.from_run(run)
    t = spec.target
    copy = place is not None
    place = place if place is not None else run
    where = str(place.path)
    ray.init(logging_level="ERROR")
    per_worker = {"CPU": t.cpus_per_process, **({"GPU": t.gpus_per_process} if t.gpus_per_process else {})}
    job = secrets.token_hex(6)  # this driver's own mark: attempts and failures are counted per job
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"run": where, "resume": resume, "job": job},
        scaling_config=ScalingConfig(
            num_workers=t.processes, use_gpu=bool(t.gpus_per_process), resources_per_worker=per_worker
        ),
        # The group's store on loopback (one machine) or rank 0's cluster address, not on every interface.
        torch_config=BoundTorchConfig(backend="nccl" if t.gpus_per_process else "gloo"),
        run_config=RunConfig(
            name="ray-train",
            storage_path=str(run.path / "ray"),  # (Ray Train's own records: ortlab reports no checkpoints to it)
            # A group that cannot be placed within target.start_timeout_s (the job's environment sets Ray Train's
            # RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S from it) is not retried: Ray Train's default retries it for
            # ever, and a run whose lost node is not replaced showed `running` for good.
            failure_config=FailureConfig(max_failures=t.max_failures, controller_failure_limit=0),
            callbacks=[Failures(where, job)],
        ),
    )
    error = None
    with Follower(place, run).following() if copy else contextlib.nullcontext():
        try:
            trainer.fit()
        except Exception as e:  # Ray Train gave up: the failures ran out, or the group could not start
            error = f"{type(e).__name__}: {e}".strip().splitlines()[0][:MAX_REASON_CHARS]
            if _startup_timed_out(e):
                error = _unplaced(t, per_worker)
    state = run.read_status().get("state")
    if error or state not in TERMINAL:
        failures = [f for f in place.records(FAILURES_FILE) if f.get("job") == job]
        last = failures[-1].get("workers") if failures and isinstance(failures[-1].get("workers"), dict) else {}
        why = "; ".join(f"rank {rank}: {reason}" for rank, reason in last.items()) or error or "no final status"
        if error and error.startswith(UNPLACED):
            message = error
        elif failures:
            message = (
                f"the Ray Train workers failed {len(failures)} time(s), more than target.max_failures "
                f"({t.max_failures}) allows; last: {why}"
            )
        else:
            message = f"the Ray Train run could not finish: {why}"
        if state == "failed":  # rank 0 said why its own process ended; the group's reason says more
            run.update_status(error=message, step=run.last_step())
        elif state not in TERMINAL:  # (a completed or stopped run keeps its end)
            run.set_status("failed", error=message, step=run.last_step())
        if copy:
            place.put_file(run.path, "status.json")
    if run.read_status().get("state") == "failed":
        raise RuntimeError(run.read_status().get("error", "the run failed"))


UNPLACED = "the cluster could not place"


def _startup_timed_out(error: BaseException) -> bool:
    """Did Ray Train give up because its worker group could not start in time (found anywhere in the chain of
    causes, and in the controller's own failure, which Ray Train wraps)?"""
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e).__name__ == "WorkerGroupStartupTimeoutError":
            return True
        todo += [e.__cause__, e.__context__, getattr(e, "controller_failure", None)]
    return False


def _unplaced(t: Any, per_worker: dict[str, float]) -> str:
    """Why the workers could not start, in the user's terms: what they ask for, what the cluster has free now."""
    import ray

    ask = ", ".join(f"{v:g} {k}" for k, v in per_worker.items())
    try:
        free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
        has = ", ".join(f"{v:g} {k}" for k, v in sorted(free.items())) or "no CPU or GPU"
    except Exception:
        has = "unknown (the cluster did not say)"
    return (
        f"{UNPLACED} {t.processes} Ray Train worker(s) of {ask} each within target.start_timeout_s "
        f"({t.start_timeout_s:g} s); free on the cluster now: {has} (a node was lost and not replaced, or other jobs "
        "hold the resources; raise target.start_timeout_s where the cluster adds nodes on demand)"
    )


def main(where: str, resume: bool) -> int:
    """The job's entrypoint (`python -m ortlab.job raytrain RUN_PLACE [--resume]`): drive the workers, printing the
    run's records for the monitor from the place's folder, or from a node-local copy following the store."""
    place = place_at(where)
    run = folder_here(place)
    if run is not None:  # a folder both sides mount
        return streamed(run, lambda: drive(run, resume))
    run = node_folder(place)
    Mirror(place, run).pull(resume=False)  # the spec and status: the workers pull what they train from
    code = streamed(run, lambda: drive(run, resume, place))
    if code == 0:
        shutil.rmtree(run.path.parent, ignore_errors=True)
    return code
