"""Ray Train on the local two-node cluster against the same data-parallel spec run locally (torchrun).

    python benchmarks/bench_raytrain.py [--steps 60] [--rounds 1] [--gpus-per-worker 0]

Measured, each against a baseline in the same run:
- steady samples/s of two Ray Train workers (one per node) over two local torchrun processes, same spec, same
  threads per process (Ray gives a 1-CPU worker OMP_NUM_THREADS=1, torchrun gives its ranks 1), in ABBA order
  (local, cluster, cluster, local; `--rounds` repeats), the median of the paired ratios. Goal >= 0.95.
- the optimizer state each rank holds with ZeRO-1 over two workers, measured on every rank (goal <= 1/2 + 5 %).
- from a killed worker (SIGKILL of rank 1 once a checkpoint exists) to the `restart` record and to the next step
  the new group writes (goal <= 60 s to that step; the new group re-imports torch and transformers first).
- the metrics' delay from the workers' stamp to the local run folder (the monitor's poll of the job's log), p95
  (goal <= 2 s). The local runs' delay is what the file watcher alone costs.

`--delay-only` runs only the cluster side (`--rounds` x 2 runs, no local runs, no killed worker) and reports its
metric delay: to compare two versions of ortlab by turns on a shared machine (run this file from each checkout).

`--storage s3-local` runs the cluster side through object storage instead of the cluster's shared folder: an
S3-protocol server (moto, from the dev dependencies) started here on loopback, each node training in its own copy
(the delay then includes rank 0's push to the store and the driver's pull from it). `--storage URI` uses a store
of yours, credentials from the environment.

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


def killed_worker(ortlab, spec: dict, target: dict, save_steps: int) -> dict:
    """Kill rank 1 once a checkpoint exists; time the restart record and the next step written after it."""
    from ortlab.job.raytrain import WORKERS_FILE as WORKERS
    from ortlab.runfolder.place import place_at

    run = ortlab.launch(
        {**spec, "name": "killed", "hyper": {**spec["hyper"], "save_steps": save_steps}, "target": target}
    )
    while run.dir.last_step() <= save_steps + 1:
        if run.state not in ("pending", "running"):
            raise SystemExit(f"the run to kill ended {run.state}: {run.status().get('error')}")
        time.sleep(0.2)
    where = run.status()["launcher"]["storage"]
    workers = list(place_at(where).records(WORKERS))
    rank1 = next(w for w in workers if w["rank"] == 1)
    last = run.dir.last_step()
    killed_at = time.time()
    os.kill(rank1["pid"], signal.SIGKILL)
    status = run.wait(timeout=600)
    metrics = run.metrics()
    restart = next((r for r in metrics if r["event"] == "restart"), None)
    after = next((r for r in metrics if r["event"] == "step" and r["step"] > last and r["time"] > killed_at), None)
    return {
        "state": status["state"],
        "killed_after_step": last,  # (the last step seen here: the workers were ahead by the metric delay)
        "resumed_from_step": restart and restart["resumes_from_step"],
        "to_restart_record_s": restart and round(restart["time"] - killed_at, 1),
        "to_next_step_s": after and round(after["time"] - killed_at, 1),
        "steps_recorded_once": [r["step"] for r in metrics if r["event"] == "step"]
        == list(range(1, spec["hyper"]["max_steps"] + 1)),
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
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: results/raytrain[-s3]-DATE.json)")
    opts = parser.parse_args()
    kind = "" if opts.storage == "shared" else "-s3" if opts.storage == "s3-local" else "-store"
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
        if opts.delay_only:
            report = delay_only(ortlab, spec, on_cluster, opts, load)
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            opts.out.write_text(json.dumps(report, indent=2) + "\n")
            print(json.dumps(report, indent=2))
            return
        for i in range(opts.rounds):
            for name in ("local", "cluster", "cluster", "local"):
                target = on_cluster if name == "cluster" else {"processes": 2}
                runs[name].append(run_once(ortlab, spec, f"{name}-{i}-{len(runs[name])}", target))
        kill = killed_worker(ortlab, spec, {**on_cluster, "max_failures": 1}, save_steps=max(4, opts.steps // 6))
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
