"""How fast the sidebar's server answers: the runs list with 200 runs, and new metrics of a running run.

    .venv/bin/python benchmarks/bench_server.py                 # 200 runs, 200 steps each, 200 requests
    .venv/bin/python benchmarks/bench_server.py --runs 500 --requests 300

Goals (issue #12): listing 200 runs <= 100 ms and serving a running run's new metrics <= 20 ms, both at p95.

What is measured: a real `jupyter server` process with ortlab's extension, started here, asked over HTTP on
loopback with a kept-alive connection (as a browser polls), timed by this client from request to full answer,
so every number is an upper bound of the server's own time. The runs are fake but valid run folders written
by hand (`tests/helpers/fake_runs.py`: spec, status, a metrics history, a result), a few of them "running" with
this process as their worker, so that the server's liveness check sees them alive. Before each list request one
running run gets a new step line (the sidebar's real case: something is always training); before each metrics
request the followed run gets one, and the request asks from the previous answer's offset.

Results go to benchmarks/results/server-<date>.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from fake_runs import append, make_fake_run, step_record  # noqa: E402

GOALS_MS = {"list_runs": 100.0, "new_metrics": 20.0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(times_s: list[float]) -> dict[str, float]:
    ms = [t * 1000 for t in times_s]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(percentile(ms, 95), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One kept-alive HTTP connection to the server, with the token."""

    def __init__(self, port: int, token: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"token {token}"}

    def get(self, path: str) -> tuple[float, int, dict]:
        t = time.perf_counter()
        self.conn.request("GET", path, headers=self.headers)
        response = self.conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - t
        return elapsed, response.status, json.loads(body) if body else {}


def start_server(work: Path, runs_root: Path, port: int, token: str) -> subprocess.Popen:
    config_dir = work / "jupyter-config"
    config_dir.mkdir()
    (config_dir / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"ortlab": True}}})
    )
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyter_server",
        f"--ServerApp.port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True",
        f"--ServerApp.root_dir={work}",
        f"--IdentityProvider.token={token}",
        f"--Ortlab.runs_root={runs_root}",
    ]
    log = (work / "server.log").open("w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_ready(client: Client, server: subprocess.Popen, work: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}):\n{(work / 'server.log').read_text()[-3000:]}")
        try:
            _, status, _ = client.get("/api/status")
            if status == 200:
                return
        except OSError:
            client.conn.close()
        time.sleep(0.2)
    raise SystemExit(f"the server did not answer within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="run folders to list")
    parser.add_argument("--running", type=int, default=10, help="how many of them are running")
    parser.add_argument("--steps", type=int, default=200, help="step records already in each run's history")
    parser.add_argument("--requests", type=int, default=200, help="timed requests of each kind")
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"server-{date.today().isoformat()}.json")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ortlab-bench-server-") as tmp:
        work = Path(tmp)
        runs_root = work / "runs"
        t = time.perf_counter()
        states = ["completed", "stopped", "failed"]
        running: list[Path] = []
        for i in range(opts.runs):
            state = "running" if i >= opts.runs - opts.running else states[i % len(states)]
            path = make_fake_run(runs_root, f"run-{i:04d}", state, steps=opts.steps, max_steps=opts.steps * 2)
            if state == "running":
                running.append(path)
        made_s = time.perf_counter() - t
        size = sum(p.stat().st_size for p in runs_root.glob("*/metrics.jsonl"))
        print(f"{opts.runs} run folders ({size / 2**20:.1f} MB of metrics) written in {made_s:.1f} s", flush=True)

        port, token = free_port(), secrets.token_hex(16)
        server = start_server(work, runs_root, port, token)
        try:
            client = Client(port, token)
            wait_ready(client, server, work)

            # The first list reads every run's whole history (later ones only what was appended).
            cold, status, body = client.get("/ortlab/api/runs")
            assert status == 200 and len(body["runs"]) == opts.runs, (status, len(body.get("runs", [])))
            print(f"first list (cold: every history read): {cold * 1000:.1f} ms", flush=True)

            list_times = []
            step = opts.steps
            for i in range(opts.requests):
                step += 1
                append(running[i % len(running)] / "metrics.jsonl", step_record(step))
                elapsed, status, body = client.get("/ortlab/api/runs")
                assert status == 200 and len(body["runs"]) == opts.runs
                list_times.append(elapsed)
            print("list:", summary(list_times), flush=True)

            followed = running[0]
            run_id = followed.name
            _, status, body = client.get(f"/ortlab/api/runs/{run_id}/metrics?offset=0")
            assert status == 200
            offset = body["offset"]
            metric_times = []
            for _ in range(opts.requests):
                step += 1
                append(followed / "metrics.jsonl", step_record(step))
                elapsed, status, body = client.get(f"/ortlab/api/runs/{run_id}/metrics?offset={offset}")
                assert status == 200 and [r["step"] for r in body["records"]] == [step], body
                offset = body["offset"]
                metric_times.append(elapsed)
            print("new metrics:", summary(metric_times), flush=True)
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    import jupyter_server

    results = {
        "list_runs": {**summary(list_times), "goal_p95_ms": GOALS_MS["list_runs"]},
        "new_metrics": {**summary(metric_times), "goal_p95_ms": GOALS_MS["new_metrics"]},
    }
    for r in results.values():
        r["meets_goal"] = r["p95_ms"] <= r["goal_p95_ms"]
    report = {
        "benchmark": "bench_server",
        "date": date.today().isoformat(),
        "what": "client-timed HTTP round trips on loopback (kept-alive) to a real jupyter server with ortlab's "
        "extension; an upper bound of the server's time",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jupyter_server": jupyter_server.__version__,
        "runs": opts.runs,
        "running": opts.running,
        "steps_per_run": opts.steps,
        "metrics_mb": round(size / 2**20, 2),
        "first_list_ms": round(cold * 1000, 1),
        **results,
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {opts.out}")
    if not all(r["meets_goal"] for r in results.values()):
        print("GOAL MISSED: " + ", ".join(n for n, r in results.items() if not r["meets_goal"]))


if __name__ == "__main__":
    main()
