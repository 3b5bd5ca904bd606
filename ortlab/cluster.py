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

The head runs in its own process group; its PID, create time and address are recorded in `head.json`.
`status` checks that recorded process (never a process found by name) and `stop` ends only that group:
`ray stop` would end every Ray process on the machine, other people's included.

Connecting to any Ray cluster (this one or `ray start`, KubeRay, Anyscale) goes through `connect`, which turns
the usual failures into errors that say what to do: unreachable address, missing or wrong token, Ray not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
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
from ortlab.addresses import credentials_problem, is_loopback, origin
from ortlab.envvars import cache_dir, child_env
from ortlab.errors import OrtlabError

LOCAL = "local"
# How long a cluster address may take to answer before it is called unreachable.
CONNECT_TIMEOUT_S = 5.0
INSTALL_HINT = "install Ray with ortlab's extra: pip install 'ortlab[remote]'"


class ClusterError(OrtlabError, RuntimeError):
    """A cluster that cannot be used as asked (the message says why and what to do)."""


def cluster_dir() -> Path:
    """Where the local head keeps its token, its record and its storage: $ORTLAB_CLUSTER_DIR, else
    ortlab's cache folder / cluster."""
    if os.environ.get("ORTLAB_CLUSTER_DIR"):
        return Path(os.environ["ORTLAB_CLUSTER_DIR"])
    return cache_dir() / "cluster"


def _record_path(folder: Path) -> Path:
    return folder / "head.json"


def token_path(folder: Path | None = None) -> Path:
    return (folder or cluster_dir()) / "auth_token"


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
    from ortlab.runfolder.rundir import process_alive

    port = urllib.parse.urlsplit(record.get("address", "")).port
    if not isinstance(record.get("pid"), int) or not process_alive(record["pid"], record.get("create_time")):
        return False
    return any(p == port and _loopback(ip) for _, _, ip, p in listeners(record["pid"]))


def _ray_program() -> str:
    here = Path(sys.executable).parent / "ray"
    if here.is_file():
        return str(here)
    found = shutil.which("ray")
    if found is None:
        raise ClusterError(f"the `ray` command is not installed in {sys.executable}'s environment: {INSTALL_HINT}")
    return found


def status(folder: Path | None = None) -> dict[str, Any]:
    """The local head's record, with `running` true only while the recorded process (same PID and create time)
    is alive."""
    from ortlab.runfolder.rundir import process_alive

    folder = folder or cluster_dir()
    try:
        record = json.loads(_record_path(folder).read_text())
    except (FileNotFoundError, ValueError):
        return {"running": False, "folder": str(folder)}
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return {"running": False, "folder": str(folder)}
    record["running"] = process_alive(record["pid"], record.get("create_time"))
    return record


def start(
    folder: Path | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    timeout: float = 180.0,
    new_token: bool = False,
) -> dict[str, Any]:
    """Start the local head (or return the running one's record); returns once it can run jobs.

    `new_token` replaces the token first (a leaked one stops working on the new head); it is refused while a
    head runs, since that head keeps the token it started with."""
    from ortlab.runfolder.rundir import process_create_time, write_json

    folder = folder or cluster_dir()
    current = status(folder)
    if current["running"]:
        if new_token:
            raise ClusterError(
                f"a local Ray head is running (pid {current['pid']}) and keeps the token it started with: stop it "
                "first (`ortlab cluster stop`), then `ortlab cluster start --new-token`"
            )
        return current
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = _ensure_token(folder, new=new_token)
    ray = _ray_program()
    dashboard, client = _free_ports(2)
    private = _private_temp()
    cmd = [
        ray,
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
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
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
    write_json(_record_path(folder), record)
    try:
        _wait_ready(record, folder, proc, timeout)
        _refuse_exposed(record, folder)
    except BaseException:
        stop(folder)
        raise
    return {**record, "running": True}


def _refuse_exposed(record: dict[str, Any], folder: Path) -> None:
    """Every listener of the started head is on loopback, or the head is refused (a Ray that changed how it binds
    must not silently open ports to the network)."""
    exposed = [
        f"{name} (pid {pid}) on {ip}:{port}" for pid, name, ip, port in listeners(record["pid"]) if not _loopback(ip)
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
    """Stop the local head this folder recorded: its process group and its descendants (Ray's workers start
    their own sessions), nothing else. True if one was running."""
    import psutil

    from ortlab.runfolder.rundir import process_alive

    folder = folder or cluster_dir()
    record = status(folder)
    if not record["running"]:  # ended by itself (a failed start): its session folder is left to remove
        _record_path(folder).unlink(missing_ok=True)
        _remove_private_temp(record.get("temp_dir"))
        return False
    pid = record["pid"]
    try:
        family = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        family = []
    # `ray start --block` ends the head's processes when it is signalled; what is left after `timeout` is killed.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(pid, record.get("create_time")) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in family:  # psutil checks that each is still the same process (pid and create time)
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(family, timeout=5)
    _record_path(folder).unlink(missing_ok=True)
    _remove_private_temp(record.get("temp_dir"))
    return True


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


# --- connecting to a cluster -----------------------------------------------------------------------------------

# Addresses (comma- or space-separated) of the Ray clusters this machine's user trusts with their Ray token.
ADDRESSES_ENV = "ORTLAB_RAY_ADDRESSES"
# Set to 1 to send the token over plain http to an address that is not this machine (it then travels in clear).
ALLOW_HTTP_ENV = "ORTLAB_RAY_ALLOW_HTTP"


def configured_addresses() -> list[str]:
    """The cluster addresses the user named in $ORTLAB_RAY_ADDRESSES: the ones a token may go to unasked."""
    return [a for a in os.environ.get(ADDRESSES_ENV, "").replace(",", " ").split() if a]


def is_configured(cluster: str) -> bool:
    """May the user's Ray token go to `cluster` without the user naming it for this very call?

    'local' (the head `ortlab cluster start` started, from its record on this machine) and the addresses in
    $ORTLAB_RAY_ADDRESSES. Not an address read from a run folder: a planted spec.yaml could name any server, and
    the token would be sent there as `Authorization: Bearer`.
    """
    if cluster == LOCAL:
        return True
    wanted = origin(cluster)
    return wanted is not None and any(origin(a) == wanted for a in configured_addresses())


def resolve_address(cluster: str) -> str:
    """The Jobs API address of `cluster` ('local' = the head `ortlab cluster start` started)."""
    if cluster == LOCAL:
        record = status()
        if not record["running"]:
            raise ClusterError(
                "target.cluster is 'local' but no local Ray head is running: start one with `ortlab cluster start`"
            )
        return record["address"]
    return cluster


def token_for(cluster: str, trusted: bool = False) -> tuple[str | None, str]:
    """(token, where it came from) for `cluster`: the local head's token file; else Ray's own sources in Ray's
    order: $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token.

    The user's own token is given only for an address the user named: `trusted` (the caller has it from the user,
    e.g. the spec passed to `launch`) or one in $ORTLAB_RAY_ADDRESSES; for any other, (None, why not).
    """
    if cluster == LOCAL:
        path = token_path()
        return (path.read_text().strip() if path.is_file() else None), f"the local head's token file {path}"
    if not (trusted or is_configured(cluster)):
        return None, (
            f"withheld: {cluster} is not an address you named (ortlab sends your Ray token only to 'local', the "
            f"addresses in ${ADDRESSES_ENV}, or an address you pass to launch or resume yourself)"
        )
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file():
        return path.read_text().strip(), f"the token file {path}"
    return None, "none found ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"


def check_transport(address: str) -> None:
    """Refuse to send a token over plain http to another machine unless the user opted in ($ORTLAB_RAY_ALLOW_HTTP=1).

    Over http the `Authorization` header travels in clear: anyone on the path can read the token and then run any
    code on the cluster. Loopback (the local head, an SSH tunnel's end) never leaves this machine.
    """
    where = origin(address)
    if where is None or where[0] != "http" or is_loopback(where[1]):
        return
    if os.environ.get(ALLOW_HTTP_ENV, "").strip().lower() in ("1", "true", "yes"):
        return
    raise ClusterError(
        f"the Ray cluster at {address} is reached over plain http, so your Ray token would travel in clear to "
        f"{where[1]} (anyone on the network path could read it and run code on the cluster). Use an https address, "
        f"or an SSH tunnel to 127.0.0.1; to send it in clear anyway, set {ALLOW_HTTP_ENV}=1"
    )


def connect(cluster: str, token: str | None = None, trusted: bool = False) -> Any:
    """A `ray.job_submission.JobSubmissionClient` for `cluster`, checked to answer and to accept our token.

    Fails fast (CONNECT_TIMEOUT_S) with what to do: Ray missing, address unreachable, authentication refused.
    `trusted`: the user named this address for this call (see `token_for`); a token passed in is always sent.
    """
    problem = credentials_problem(cluster)
    if problem:
        raise ClusterError(f"target.cluster: {problem}")
    address = resolve_address(cluster)
    if not address.startswith(("http://", "https://")):
        raise ClusterError(
            f"target.cluster {cluster!r} is not a Ray Jobs address: give the dashboard's http://HOST:PORT "
            "(default port 8265), or 'local'"
        )
    where = "given"
    if token is None:
        token, where = token_for(cluster, trusted=trusted)
    if token:
        check_transport(address)
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise ClusterError(f"remote runs need Ray, which is not installed: {INSTALL_HINT}") from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # A plain request first: it fails in seconds where Ray's client would retry, and it shows the HTTP status.
    request = urllib.request.Request(address.rstrip("/") + "/api/jobs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S):
            pass
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            problem = "no token was sent" if not token else "the token was refused"
            raise ClusterError(
                f"the Ray cluster at {address} refused the request: an authentication problem ({problem}; token "
                f"source: {where}). Put the cluster's token in $RAY_AUTH_TOKEN or the file $RAY_AUTH_TOKEN_PATH "
                "(for 'local': `ortlab cluster start` makes it)"
            ) from None
        raise ClusterError(f"the Ray cluster at {address} answered HTTP {e.code}: is it a Ray dashboard?") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ClusterError(
            f"the Ray cluster at {address} is unreachable ({reason}); check the address (the dashboard's port, "
            "default 8265) and that the cluster is up"
        ) from None
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)  # Ray's own warnings go to the run's log, not the screen
    try:
        return JobSubmissionClient(address, headers=headers)
    except Exception as e:  # (Ray's client reads the server's version first: a KeyError from another server)
        raise ClusterError(
            f"the server at {address} answered, but not as a Ray dashboard ({type(e).__name__}: {e}); check the "
            "address (the dashboard's port, default 8265)"
        ) from None
