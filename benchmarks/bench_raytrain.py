"""Ray Train on the local two-node cluster against the same data-parallel spec run locally (torchrun).

    python benchmarks/bench_raytrain.py [--steps 60] [--rounds 1] [--gpus-per-worker 0]

Measured, each against a baseline in the same run:
- steady samples/s of two Ray Train workers (one per node) over two local torchrun processes, same spec, same
  threads per process (Ray gives a 1-CPU worker OMP_NUM_THREADS=1, torchrun gives its ranks 1), in ABBA order
  (local, cluster, cluster, local; `--rounds` repeats), the median of the paired ratios. Goal >= 0.95.
- the optimizer state each rank holds with ZeRO-1 over two workers, measured on every rank (goal <= 1/2 + 5 %).
- from a killed worker (SIGKILL of rank `--kill-rank`, default 0, once a checkpoint exists) to the next step the
  new group writes (goal <= 60 s), and to each phase of the restart on the way (`killed_worker.phases`).
- the metrics' delay from the workers' stamp to the local run folder (the monitor's poll of the job's log), p95
  (goal <= 2 s). The local runs' delay is what the file watcher alone costs.

`--delay-only` runs only the cluster side (`--rounds` x 2 runs, no local runs, no killed worker) and reports its
metric delay: to compare two versions of ortlab by turns on a shared machine (run this file from each checkout).

`--kill-only` runs only the killed worker (`--rounds` times, on a fresh run each) and reports the restart's
phases, the machine's load at each kill: results/raytrain[-s3]-kill<RANK>-<date>.json.

`--storage s3-local` runs the cluster side through object storage instead of the cluster's shared folder: an
S3-protocol server (moto, from the dev dependencies) started here on loopback, each node training in its own copy
(the delay then includes rank 0's push to the store and the driver's pull from it). `--storage URI` uses a store
of yours, credentials from the environment.

The head and its node run this interpreter (`python` in the JSON): before ortlab started the head with it, the head
ran the one its `ray` script names, a venv reached through a link then ran two paths, and DeepSpeed rebuilt its CPU
op at every group start (docs/decisions/ray.md). `TORCH_EXTENSIONS_DIR` in a folder of its own keeps other processes
of the machine from rebuilding that op under it.

The cluster (a head and a worker node, `--cpus-per-node` each) is started here and stopped by its PIDs at the
end. `--gpus-per-worker` gives each worker GPUs (a GPU cluster: start it yourself and pass `--cluster ADDRESS`).
Results go to benchmarks/results/raytrain-<date>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

from bench_remote import cluster_spec, follow_delays, sides  # noqa: E402


def run_once(ortlab, spec: dict, name: str, target: dict) -> dict:
    t0 = time.monotonic()
    run = ortlab.launch({**spec, "name": name, "target": target})
    delays = follow_delays(run)
    status = run.wait(timeout=120)
    if status["state"] != "completed":
        raise SystemExit(f"{name} ended {status['state']}: {status.get('error')}")
    from ortlab.runfolder.compare import summarize

    summary = summarize(run.metrics())
    out = {"steady_samples_per_s": summary.get("steady_samples_per_s"), "wall_s": round(time.monotonic() - t0, 1)}
    zero = (run.result() or {}).get("accelerations", {}).get("zero1", {})
    if zero.get("applied"):
        out["optimizer_state_share_by_rank"] = zero["details"].get("optimizer_state_share_by_rank")
    print(name, out, flush=True)
    return {**out, "delays": delays}


def killed_worker(ortlab, spec: dict, target: dict, save_steps: int, rank: int = 0) -> dict:
    """Kill `rank` once a checkpoint exists; time the restart's phases up to the next step written after it.

    Each phase is the time from the kill to a stamp the run itself wrote (one clock: every process is on this
    machine): Ray Train's controller recording the failure, the new group's processes starting, entering the
    training loop (their imports done, the process group set up), agreeing on the attempt, rank 0's `restart`
    record, its `resume` record (spec checked, data and model loaded, trainer built), `train_begin` (DeepSpeed's
    engine up, the checkpoint restored) and the first step record after the kill (the steps since the checkpoint
    trained again first; they are not written twice)."""
    from ortlab.job.raytrain import FAILURES_FILE, WORKERS_FILE
    from ortlab.runfolder.place import place_at

    run = ortlab.launch(
        {**spec, "name": f"killed-rank{rank}", "hyper": {**spec["hyper"], "save_steps": save_steps}, "target": target}
    )
    while run.dir.last_step() <= save_steps + 1:
        if run.state not in ("pending", "running"):
            raise SystemExit(f"the run to kill ended {run.state}: {run.status().get('error')}")
        time.sleep(0.2)
    place = place_at(run.status()["launcher"]["storage"])
    first = [w for w in place.records(WORKERS_FILE) if w["attempt"] == 0]
    victim = next(w for w in first if w["rank"] == rank)
    last = run.dir.last_step()
    load_at_kill = os.getloadavg()
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    status = run.wait(timeout=600)
    metrics = run.metrics()
    after = [r for r in metrics if r.get("time", 0) > killed_at]
    restart = next((r for r in after if r["event"] == "restart"), None)
    step = next((r for r in after if r["event"] == "step" and r["step"] > last), None)
    failure = next((f for f in place.records(FAILURES_FILE) if f["time"] > killed_at), None)
    again = [w for w in place.records(WORKERS_FILE) if w["attempt"] == 1]

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - killed_at, 1)

    def stamp(event: str) -> float | None:
        return next((r["time"] for r in after if r["event"] == event), None)

    def latest(key: str, pick=max) -> float | None:
        values = [w[key] for w in again if key in w]
        return pick(values) if values else None

    phases = {
        "detected_s": since(failure and failure["time"]),  # Ray Train's controller saw the failure (its callback)
        "group_started_s": since(latest("started", min)),  # the first new worker process started
        "loop_entered_s": since(latest("entered")),  # every new worker in the training loop (imports, group)
        "group_ready_s": since(latest("time")),  # every rank agreed on the attempt (copies pulled)
        "restart_record_s": since(restart and restart["time"]),
        "loaded_s": since(stamp("resume")),  # rank 0: spec checked, data and model loaded, trainer built
        "checkpoint_loaded_s": since(stamp("train_begin")),  # DeepSpeed's engine up, checkpoint restored
        "next_step_s": since(step and step["time"]),
    }
    return {
        "state": status["state"],
        "killed_rank": rank,
        "load_at_kill": [round(x, 2) for x in load_at_kill],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "killed_after_step": last,  # (the last step seen here: the workers were ahead by the metric delay)
        "resumed_from_step": restart and restart["resumes_from_step"],
        "to_restart_record_s": phases["restart_record_s"],
        "to_next_step_s": phases["next_step_s"],
        "phases": phases,
        "failure": failure and failure["workers"],
        "steps_recorded_once": [r["step"] for r in metrics if r["event"] == "step"]
        == list(range(1, spec["hyper"]["max_steps"] + 1)),
    }


def kill_only(ortlab, spec: dict, on_cluster: dict, opts: argparse.Namespace, load: list[float]) -> dict:
    """Only the killed worker (`--rounds` times): the restart's phases, with the load at each kill."""
    kills = [
        killed_worker(ortlab, spec, {**on_cluster, "max_failures": 1}, opts.save_steps, opts.kill_rank)
        for _ in range(opts.rounds)
    ]
    load.append(os.getloadavg()[0])
    worst = max((k["to_next_step_s"] for k in kills if k["to_next_step_s"] is not None), default=None)
    return {
        "benchmark": "raytrain --kill-only",
        "date": date.today().isoformat(),
        "cpu_count": os.cpu_count(),
        "storage": opts.storage,
        "steps": opts.steps,
        "cpus_per_node": opts.cpus_per_node,
        "python": sys.executable,
        "torch_extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR", "(torch's default)"),
        "load_1min_at_start_and_end": [round(x, 2) for x in load],
        "killed_worker": kills[0] if len(kills) == 1 else kills,
        "goals": {"killed_worker.to_next_step_s": "<= 60"},
        "meets_goals": {
            "killed_worker.to_next_step_s": worst is not None
            and worst <= 60
            and all(k["steps_recorded_once"] and k["state"] == "completed" for k in kills)
        },
    }


def delay_only(ortlab, spec: dict, on_cluster: dict, opts: argparse.Namespace, load: list[float]) -> dict:
    """The cluster side alone, `--rounds` x 2 runs: its metric delay (the 1-minute load before and after)."""
    from bench_remote import percentile

    delays: list[float] = []
    for i in range(opts.rounds * 2):
        delays += run_once(ortlab, spec, f"cluster-{i}", on_cluster)["delays"]
    load.append(os.getloadavg()[0])
    return {
        "benchmark": "raytrain --delay-only",
        "date": date.today().isoformat(),
        "storage": opts.storage,
        "steps": opts.steps,
        "runs": opts.rounds * 2,
        "load_1min_at_start_and_end": [round(x, 2) for x in load],
        "delay_p50_s": round(percentile(delays, 50), 3),
        "delay_p95_s": round(percentile(delays, 95), 3),
        "delay_max_s": round(max(delays), 3),
        "records": len(delays),
    }


@contextlib.contextmanager
def local_s3(work: Path) -> Iterator[str]:
    """An S3-protocol server (moto) on loopback with a fresh bucket and dummy credentials for both sides (the
    cluster started after this inherits them); yields the storage URI."""
    from pyarrow import fs as pafs

    from ortlab.netutil import free_port

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1")
    port = free_port()
    with (work / "moto.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        options = f"endpoint_override=http://127.0.0.1:{port}&scheme=http"
        deadline = time.monotonic() + 60
        while True:
            try:
                pafs.FileSystem.from_uri(f"s3://bench?{options}&allow_bucket_creation=true")[0].create_dir("bench")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the S3 server did not start: see {work / 'moto.log'}") from None
                time.sleep(0.5)
        yield f"s3://bench/runs?{options}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each: 2 local and 2 cluster runs)")
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--gpus-per-worker", type=float, default=0)
    parser.add_argument("--cluster", default=None, help="an existing cluster's address (default: start one here)")
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: a tiny BERT built here)")
    parser.add_argument(
        "--storage", default="shared", help="'shared' (the cluster's folder), 's3-local' (moto here) or a store URI"
    )
    parser.add_argument("--delay-only", action="store_true", help="only the cluster side's metric delay")
    parser.add_argument("--kill-only", action="store_true", help="only the killed worker's restart (--rounds times)")
    parser.add_argument("--kill-rank", type=int, choices=(0, 1), default=0, help="the rank killed (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: results/raytrain[-s3]-DATE.json)")
    opts = parser.parse_args()
    opts.save_steps = max(4, opts.steps // 6)
    kind = "" if opts.storage == "shared" else "-s3" if opts.storage == "s3-local" else "-store"
    kind += f"-kill{opts.kill_rank}" if opts.kill_only else ""
    opts.out = opts.out or HERE / "results" / f"raytrain{kind}-{date.today().isoformat()}.json"

    import ortlab
    from ortlab import cluster

    work = Path(tempfile.mkdtemp(prefix="bench-raytrain-"))
    if opts.cluster is None:
        os.environ["ORTLAB_CLUSTER_DIR"] = str(work / "cluster")
    spec = cluster_spec(work, opts.model, opts.steps, zero_stage=1)
    on_cluster = {
        "cluster": opts.cluster or "local",
        "processes": 2,
        "cpus_per_process": opts.cpus_per_node,
        "gpus_per_process": opts.gpus_per_worker,
    }
    runs: dict[str, list[dict]] = {"local": [], "cluster": []}
    with contextlib.ExitStack() as stack:
        if opts.storage == "s3-local":
            on_cluster["storage"] = stack.enter_context(local_s3(work))
        elif opts.storage != "shared":
            on_cluster["storage"] = opts.storage
        started = time.monotonic()
        if opts.cluster is None:
            cluster.start(num_cpus=opts.cpus_per_node, nodes=2)
            stack.callback(cluster.stop)
        start_s = time.monotonic() - started
        load = [os.getloadavg()[0]]
        if opts.delay_only or opts.kill_only:
            only = delay_only if opts.delay_only else kill_only
            report = only(ortlab, spec, on_cluster, opts, load)
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            opts.out.write_text(json.dumps(report, indent=2) + "\n")
            print(json.dumps(report, indent=2))
            return
        for i in range(opts.rounds):
            for name in ("local", "cluster", "cluster", "local"):
                target = on_cluster if name == "cluster" else {"processes": 2}
                runs[name].append(run_once(ortlab, spec, f"{name}-{i}-{len(runs[name])}", target))
        kill = killed_worker(ortlab, spec, {**on_cluster, "max_failures": 1}, opts.save_steps, opts.kill_rank)
        load.append(os.getloadavg()[0])
    results, pairs = sides(runs, "local", "cluster")
    for name, done in runs.items():
        results[name]["optimizer_state_share_by_rank"] = [r.get("optimizer_state_share_by_rank") for r in done]
    ratio = statistics.median(pairs)
    shares = [s for r in runs["cluster"] for s in (r.get("optimizer_state_share_by_rank") or [])]
    worst_share = max(shares) if shares else None
    report = {
        "benchmark": "raytrain",
        "date": date.today().isoformat(),
        "cpu_count": os.cpu_count(),
        "steps": opts.steps,
        "cluster": opts.cluster or "local: a head and one worker node on this machine",
        "storage": {"shared": "the cluster's shared folder", "s3-local": "S3 (moto on loopback)"}.get(
            opts.storage, "a store URI (given)"
        ),
        "cpus_per_node": opts.cpus_per_node,
        "gpus_per_worker": opts.gpus_per_worker,
        "model": "tiny-bert (tests/helpers)" if opts.model is None else str(opts.model),
        "cluster_start_s": round(start_s, 1),
        "python": sys.executable,
        "load_1min_at_start_and_end": [round(x, 2) for x in load],
        **results,
        "samples_per_s_ratio_pairs": [round(p, 3) for p in pairs],
        "samples_per_s_ratio": round(ratio, 3),
        "optimizer_state_share_max": worst_share,
        "killed_worker": kill,
        "goals": {
            "samples_per_s_ratio": ">= 0.95",
            "optimizer_state_share_max": "<= 0.55",
            "killed_worker.to_next_step_s": "<= 60",
            "cluster.delay_p95_s": "<= 2.0",
        },
        "meets_goals": {
            "samples_per_s_ratio": ratio >= 0.95,
            "optimizer_state_share_max": worst_share is not None and worst_share <= 0.55,
            "killed_worker.to_next_step_s": kill["to_next_step_s"] is not None and kill["to_next_step_s"] <= 60,
            "cluster.delay_p95_s": results["cluster"]["delay_p95_s"] <= 2.0,
        },
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
