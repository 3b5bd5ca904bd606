"""A local Ray head to run remote runs on: `ortlab cluster start | status | stop`.

The head is what `target.cluster: local` means, and what the tests use. It is an ordinary Ray head (`ray start
--head --block`) with token authentication on: Ray's Jobs API runs any command it is sent, so a head without a
token would let any local user run code as you. ortlab generates the token and keeps it in a 0600 file in its
cache folder (`RAY_AUTH_TOKEN_PATH` points the head at it); it is never printed nor put in a run folder.
`ortlab cluster start --new-token` replaces it (a stopped head only: a running head keeps the token it read).

Every listener of every process of the head is on 127.0.0.1, which `--node-ip-address=127.0.0.1` alone does not
give: Ray turns 127.0.0.1 into the machine's address unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (its local-only
mode), and only a loopback node address makes GCS, raylet, workers, agents and metrics servers bind loopback.
Ray binds its own ports (port 0, each process reports what it got), so no port is picked, released and bound
later (a window in which another local user could listen there and receive the token Ray's processes send each
other). Two ports are not left to Ray: the dashboard's (ortlab must know it, and on port 0 the dashboard's
HTTP server cannot be told from its metrics server in the same process) and the client server's (`ray start`
cannot switch it off; nothing sends it a token). Those are picked free; before any token is sent to the dashboard,
its port is checked to be listened on by the head's own process tree, so a squatter makes the start fail, never
receives the token. Once ready, the
head is refused (stopped, with an error) if any of its processes listens beyond loopback. Ray's session files
live in a fresh 0700 folder under /tmp (unpredictable name; Ray makes its own folders 0777, so the private one is
their parent).

The head runs in its own session; its PID, create time and address are recorded in `head.json`. `status` checks
that recorded process (never a process found by name) and `stop` ends the head's session and those of its worker
nodes, whichever process in them died first (`ortlab.cluster.procs`), and nothing else: `ray stop` would end every
Ray process on the machine, other people's included. A lock in the folder (`record.cluster_lock`) keeps to one start at
a time: two at the same moment made two heads, one of them unrecorded and left running.

Several nodes on this one machine (`nodes=K`, what Ray's own tests do to try multi-node behaviour): after the head,
K-1 worker nodes join it (`python -m ortlab.cluster.node GCS`, the GCS address from the head's session folder; why
not `ray start --address`: see that module), each with its own CPUs and GPUs, the same token, loopback only, each
in its own session with its PID recorded in `head.json` beside the head's; `stop` ends them first.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.cluster import procs
from ortlab.cluster.connect import connect
from ortlab.cluster.record import (
    INSTALL_HINT,
    ClusterError,
    cluster_dir,
    cluster_lock,
    record_path,
    roots,
    status,
    token_path,
    write_record,
)
from ortlab.envvars import child_cwd, child_env
from ortlab.runfolder.processes import process_alive, process_create_time

# Nodes on this one machine: each is a raylet and its agents (~300 MiB); more than a few only share the same CPUs.
MAX_NODES = 8


def _ensure_token(folder: Path, new: bool = False) -> Path:
    """The local head's token file: created (or, with `new`, replaced) with owner-only permissions from the start
    (never readable by others, even for an instant), atomically and without following a link."""
    path = token_path(folder)
    if new or not path.exists():
        safeio.write_bytes(folder, path.name, secrets.token_hex(32).encode(), durable=True, mode=0o600)
    try:
        fd = safeio.open_in(folder, path.name)  # a link planted there is refused, not followed
    except safeio.UnsafePath:
        raise ClusterError(
            f"the head's token file {path} is a link or not a regular file, so it is not used: replace it with "
            "`ortlab cluster start --new-token`"
        ) from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _private_temp() -> Path:
    """A fresh folder for Ray's session files that only this user can enter: an unpredictable name, mode 0700.

    Ray makes its temp folder and everything in it 0777 (it chmods them, whatever they were created with), so Ray
    gets a subfolder of this one. Under /tmp, not $TMPDIR: Ray's unix sockets live below it, and a socket's path
    must stay under about 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="ortlab-ray-", dir="/tmp"))


def listeners(pid: int) -> list[tuple[int, str, str, int]]:
    """Every listening TCP socket and bound UDP socket of `pid` and its descendants: (pid, name, ip, port)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for proc in family:
        try:
            name = proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.Error:  # ended meanwhile
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                found.append((proc.pid, name, c.laddr.ip, c.laddr.port))
    return found


def _loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def dashboard_is_ours(record: dict[str, Any]) -> bool:
    """Is the recorded head alive and its dashboard port listened on, on loopback, by the head's own process tree?

    Check it before sending the head a token: the port was picked free and handed to Ray, so in between another
    local user could have started listening there."""

    port = urllib.parse.urlsplit(record.get("address", "")).port
    if not isinstance(record.get("pid"), int) or not process_alive(record["pid"], record.get("create_time")):
        return False
    return any(p == port and _loopback(ip) for _, _, ip, p in listeners(record["pid"]))


def _ray_program() -> list[str]:
    """`ray`'s command line run by this very interpreter, as the worker nodes are (`_start_node`).

    Not the `ray` script beside it: its first line names the interpreter by the path it was installed under, and a
    venv reached through a link then ran the head and its nodes under two paths. DeepSpeed keys its compiled CPU
    ops by the interpreter's path, so every ZeRO group start on the other path rebuilt one (about 45 s of a 109 s
    restart after a lost rank 0, issue #42)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ClusterError(f"Ray is not installed in {sys.executable}'s environment: {INSTALL_HINT}")
    return [sys.executable, "-m", "ray.scripts.scripts"]


def start(
    folder: Path | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    timeout: float = 180.0,
    new_token: bool = False,
    nodes: int | None = None,
) -> dict[str, Any]:
    """Start the local head (or return the running one's record); returns once it can run jobs.

    `num_cpus`, `num_gpus`: what each node offers (default: Ray's count of this machine's). `nodes`: how many
    nodes in all, the head included (default 1; for a running head, None accepts whatever it has).
    `new_token` replaces the token first (a leaked one stops working on the new head); it is refused while a
    head runs, since that head keeps the token it started with. One start at a time per folder: another one
    under way is refused (`ClusterError`)."""
    folder = folder or cluster_dir()
    if nodes is not None and not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"nodes: give 1 to {MAX_NODES} nodes (the head and its worker nodes), not {nodes}")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with cluster_lock(folder, wait=False):
        return _start(folder, num_cpus, num_gpus, timeout, new_token, nodes)


def _start(
    folder: Path, num_cpus: int | None, num_gpus: int | None, timeout: float, new_token: bool, nodes: int | None
) -> dict[str, Any]:
    current = status(folder)
    if current["running"]:
        if new_token:
            raise ClusterError(
                f"a local Ray head is running (pid {current['pid']}) and keeps the token it started with: stop it "
                "first (`ortlab cluster stop`), then `ortlab cluster start --new-token`"
            )
        has = 1 + len(current.get("nodes") or [])
        ended = [str(n["pid"]) for n in current.get("nodes") or [] if not n["running"]]
        if ended:  # its runs would wait for the lost nodes' CPUs and GPUs for ever
            raise ClusterError(
                f"the local Ray head (pid {current['pid']}) runs, but {len(ended)} of its {has - 1} worker node(s) "
                f"ended (pid {', '.join(ended)}): stop it (`ortlab cluster stop`) and start it again"
            )
        if nodes is not None and nodes != has:
            raise ClusterError(
                f"a local Ray head with {has} node(s) is running (pid {current['pid']}): stop it first (`ortlab "
                f"cluster stop`), then start one with {nodes}"
            )
        return current
    _stop(folder, 5.0)  # what is left of an ended head (a killed `ray start` leaves Ray's agents running)
    token = _ensure_token(folder, new=new_token)
    dashboard, client = _free_ports(2)
    private = _private_temp()
    cmd = [
        *_ray_program(),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--port=0",  # GCS: Ray binds a free port itself and tells its processes through the session folder
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        "--dashboard-agent-listen-port=0",  # Ray's default is a fixed 52365
        f"--ray-client-server-port={client}",  # cannot be switched off (0 is refused); ortlab does not use it
        "--no-monitor",  # the autoscaler (and its metrics server): a fixed single-node head has nothing to scale
        f"--temp-dir={private / 'ray'}",
        "--disable-usage-stats",
        *([f"--num-cpus={num_cpus}"] if num_cpus is not None else []),
        *([f"--num-gpus={num_gpus}"] if num_gpus is not None else []),
    ]
    env = child_env()
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    # Jobs run with the `python` on the head's PATH: this interpreter's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        # Ray's local-only mode: without it Ray replaces 127.0.0.1 by the machine's address, and its processes
        # then listen on that address or on all of them.
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        # The dashboard's Prometheus server: a free port of its own instead of the fixed 44227 (two heads clash).
        DASHBOARD_METRIC_PORT="0",
    )
    log = folder / "head.log"
    try:
        with log.open("ab") as out:
            proc = _spawn(cmd, out, env)
    except OSError:
        _remove_private_temp(str(private))
        raise
    record = {
        "pid": proc.pid,
        "create_time": process_create_time(proc.pid),
        "address": f"http://127.0.0.1:{dashboard}",
        "temp_dir": str(private),
        "storage": str(folder / "storage"),
        "log": str(log),
        "started": time.time(),
    }
    write_record(folder, record)
    try:
        _wait_ready(record, folder, proc, timeout)
        if (nodes or 1) > 1:
            gcs = safeio.read_bytes(private / "ray", "ray_current_cluster", limit=256).decode().strip()
            each = {"num_cpus": num_cpus, "num_gpus": num_gpus}
            record["nodes"] = []
            for index in range(1, nodes or 1):  # recorded one by one: a failed start still stops the started ones
                record["nodes"].append(_start_node(gcs, private, env, folder / f"node-{index}.log", each))
                write_record(folder, record)
                # One at a time: nodes that start together in one session folder pick the same names for their
                # sockets and logs (seen: the second raylet's "bind: Address already in use", then a timeout).
                _wait_nodes(record, folder, index + 1, timeout)
        _refuse_exposed(record, folder)
    except BaseException:
        _stop(folder, 5.0)
        raise
    return {**record, "running": True}


def _spawn(cmd: list[str], out: Any, env: dict[str, str]) -> subprocess.Popen:
    """A process of the head (`ray start`, a worker node): its output to `out`, its own session (how `stop` finds
    every process it leaves), in ortlab's folder with a safe path (`child_env`), so Ray's processes and the jobs'
    entrypoints import nothing from the folder the user started it in."""
    return subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=child_cwd(),
        start_new_session=True,
    )


def _start_node(gcs: str, private: Path, env: dict[str, str], log: Path, each: dict[str, int | None]) -> dict:
    """One worker node joining the head at `gcs` (Ray's GCS address, from the head's session folder), through
    `ortlab.cluster.node`: loopback only, the head's token and session folder, its own session. Returns its
    record (pid, create time, log)."""

    cmd = [sys.executable, "-m", "ortlab.cluster.node", gcs, f"--temp-dir={private / 'ray'}"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in each.items() if v is not None]
    with log.open("ab") as out:
        proc = _spawn(cmd, out, env)
    return {"pid": proc.pid, "create_time": process_create_time(proc.pid), "log": str(log)}


def alive_nodes(record: dict[str, Any], folder: Path) -> int | None:
    """How many nodes the head's dashboard counts alive (its state API), or None when it does not answer."""
    request = urllib.request.Request(
        record["address"] + "/api/v0/nodes?limit=1000",
        headers={"Authorization": f"Bearer {token_path(folder).read_text().strip()}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # (our own head's loopback dashboard)
            data = json.loads(response.read(4 * 1024 * 1024))
        rows = data["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sum(1 for row in rows if isinstance(row, dict) and row.get("state") == "ALIVE")


def _wait_nodes(record: dict[str, Any], folder: Path, nodes: int, timeout: float) -> None:

    deadline = time.monotonic() + timeout
    while (alive_nodes(record, folder) or 0) < nodes:
        for node in record["nodes"]:
            if not process_alive(node["pid"], node["create_time"]):
                raise ClusterError(f"a worker node of the local head ended at start; see {node['log']}")
        if time.monotonic() > deadline:
            raise ClusterError(f"the local head's {nodes - 1} worker node(s) did not join within {timeout:.0f} s")
        time.sleep(0.5)


def _refuse_exposed(record: dict[str, Any], folder: Path) -> None:
    """Every listener of the started head is on loopback, or the head is refused (a Ray that changed how it binds
    must not silently open ports to the network)."""
    pids = [record["pid"], *(node["pid"] for node in record.get("nodes") or [])]
    exposed = [
        f"{name} (pid {pid}) on {ip}:{port}"
        for root in pids
        for pid, name, ip, port in listeners(root)
        if not _loopback(ip)
    ]
    if exposed:
        raise ClusterError(
            "the Ray head listens beyond loopback, so ortlab stopped it: "
            + "; ".join(exposed)
            + f". Is this Ray version supported? See {folder / 'head.log'}"
        )


def _wait_ready(record: dict[str, Any], folder: Path, proc: subprocess.Popen, timeout: float) -> None:
    """The dashboard answers before jobs can run: the head is ready once a no-op job has succeeded. No token is
    sent before the dashboard's port is seen listened on by the head's own processes."""
    deadline = time.monotonic() + timeout
    client = None
    while client is None:
        if proc.poll() is not None:
            raise ClusterError(f"the Ray head ended at start (exit {proc.returncode}); see {folder / 'head.log'}")
        try:
            if dashboard_is_ours(record):
                client = connect(record["address"], token=token_path(folder).read_text().strip())
        except ClusterError:
            pass
        if client is None:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the Ray head did not answer within {timeout:.0f} s (is another process on its dashboard port "
                    f"{record['address']}?); see {folder / 'head.log'}"
                ) from None
            time.sleep(0.5)
    job = None
    while job is None:
        try:
            job = client.submit_job(entrypoint="true", submission_id=f"ortlab-ready-{secrets.token_hex(4)}")
        except RuntimeError:  # "No available agent to submit job, please try again later"
            if time.monotonic() > deadline or proc.poll() is not None:
                raise ClusterError(
                    f"the Ray head did not accept a job within {timeout:.0f} s; see {folder / 'head.log'}"
                ) from None
            time.sleep(0.5)
    while True:
        state = str(client.get_job_status(job).value)
        if state == "SUCCEEDED":
            return
        if state in ("FAILED", "STOPPED"):
            raise ClusterError(f"the Ray head cannot run jobs ({client.get_job_info(job).message}); see {folder}")
        if time.monotonic() > deadline or proc.poll() is not None:
            raise ClusterError(f"the Ray head could not run a job within {timeout:.0f} s; see {folder / 'head.log'}")
        time.sleep(0.3)


def stop(folder: Path | None = None, timeout: float = 5.0) -> bool:
    """Stop the local head this folder recorded and every process it started: the sessions of the head and of its
    worker nodes (see `ortlab.cluster.procs`), whichever of them died first; nothing else. Waits for a start under
    way to finish first. True if anything was running."""
    folder = folder or cluster_dir()
    if not folder.is_dir():
        return False
    with cluster_lock(folder, wait=True):
        return _stop(folder, timeout)


def _stop(folder: Path, timeout: float) -> bool:
    record = status(folder)
    if "pid" not in record:
        return False
    running = record["running"] or any(n["running"] for n in record["nodes"]) or bool(record["leftovers"])
    procs.end(roots(record), timeout)  # the worker nodes first, then the head
    record_path(folder).unlink(missing_ok=True)
    _remove_private_temp(record.get("temp_dir"))
    return running


def _remove_private_temp(path: Any) -> None:
    """Remove the head's session folder: only a real folder of ours that `_private_temp` could have made (the
    record is a file; a path in it is not trusted further than that)."""
    if not isinstance(path, str) or Path(path).parent != Path("/tmp") or not Path(path).name.startswith("ortlab-ray-"):
        return
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
        shutil.rmtree(path, ignore_errors=True)
