"""A local Ray head to run remote runs on: `ortlab cluster start | status | stop`.

The head is what `target.cluster: local` means, and what the tests use. It is an ordinary Ray head (`ray start
--head --block`) with everything bound to 127.0.0.1, explicit free ports (two heads on one machine must not clash
on Ray's defaults), and token authentication on: Ray's Jobs API runs any command it is sent, so a head without a
token would let any local user run code as you. ortlab generates the token and keeps it in a 0600 file in its
cache folder (`RAY_AUTH_TOKEN_PATH` points the head at it); it is never printed nor put in a run folder.

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
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ortlab.addresses import credentials_problem, is_loopback, origin

LOCAL = "local"
# How long a cluster address may take to answer before it is called unreachable.
CONNECT_TIMEOUT_S = 5.0
INSTALL_HINT = "install Ray with ortlab's extra: pip install 'ortlab[remote]'"


class ClusterError(RuntimeError):
    """A cluster that cannot be used as asked (the message says why and what to do)."""


def cluster_dir() -> Path:
    """Where the local head keeps its token, its record and its storage: $ORTLAB_CLUSTER_DIR, else
    ortlab's cache folder / cluster."""
    if os.environ.get("ORTLAB_CLUSTER_DIR"):
        return Path(os.environ["ORTLAB_CLUSTER_DIR"])
    from ortlab.probe import cache_dir

    return cache_dir() / "cluster"


def _record_path(folder: Path) -> Path:
    return folder / "head.json"


def token_path(folder: Path | None = None) -> Path:
    return (folder or cluster_dir()) / "auth_token"


def _ensure_token(folder: Path) -> Path:
    """The local head's token file, created once with owner-only permissions (never readable by others, even
    for an instant: the file is created 0600, not chmodded afterwards)."""
    path = token_path(folder)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
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
    from ortlab.runner.rundir import process_alive

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
    folder: Path | None = None, num_cpus: int | None = None, num_gpus: int | None = None, timeout: float = 180.0
) -> dict[str, Any]:
    """Start the local head (or return the running one's record); returns once it can run jobs."""
    from ortlab.runner import _child_env
    from ortlab.runner.rundir import process_create_time, write_json

    folder = folder or cluster_dir()
    current = status(folder)
    if current["running"]:
        return current
    folder.mkdir(parents=True, exist_ok=True)
    token = _ensure_token(folder)
    ray = _ray_program()
    gcs, dashboard, client, agent, agent_grpc, metrics, env_agent, node_mgr, obj_mgr = _free_ports(9)
    # Ray's session folder holds unix sockets whose paths must stay short (about 100 characters).
    temp = Path("/tmp") / f"ortlab-ray-{os.getuid()}-{gcs}"
    cmd = [
        ray,
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--ray-client-server-port={client}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={env_agent}",
        f"--node-manager-port={node_mgr}",
        f"--object-manager-port={obj_mgr}",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
        *([f"--num-cpus={num_cpus}"] if num_cpus is not None else []),
        *([f"--num-gpus={num_gpus}"] if num_gpus is not None else []),
    ]
    env = _child_env()
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    # Jobs run with the `python` on the head's PATH: this interpreter's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0")
    log = folder / "head.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    record = {
        "pid": proc.pid,
        "create_time": process_create_time(proc.pid),
        "address": f"http://127.0.0.1:{dashboard}",
        "gcs_address": f"127.0.0.1:{gcs}",
        "temp_dir": str(temp),
        "storage": str(folder / "storage"),
        "log": str(log),
        "started": time.time(),
    }
    write_json(_record_path(folder), record)
    try:
        _wait_ready(record, folder, proc, timeout)
    except BaseException:
        stop(folder)
        raise
    return {**record, "running": True}


def _wait_ready(record: dict[str, Any], folder: Path, proc: subprocess.Popen, timeout: float) -> None:
    """The dashboard answers before jobs can run: the head is ready once a no-op job has succeeded."""
    deadline = time.monotonic() + timeout
    client = None
    while client is None:
        if proc.poll() is not None:
            raise ClusterError(f"the Ray head ended at start (exit {proc.returncode}); see {folder / 'head.log'}")
        try:
            client = connect(record["address"], token=token_path(folder).read_text().strip())
        except ClusterError:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the Ray head did not answer within {timeout:.0f} s; see {folder / 'head.log'}"
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

    from ortlab.runner.rundir import process_alive

    folder = folder or cluster_dir()
    record = status(folder)
    if not record["running"]:
        _record_path(folder).unlink(missing_ok=True)
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
    if record.get("temp_dir", "").startswith("/tmp/ortlab-ray-"):
        shutil.rmtree(record["temp_dir"], ignore_errors=True)
    return True


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
