"""Where the local head keeps its record and token, and its status: what both starting a head and connecting to
one read (`ortlab.cluster`); the lock that keeps one head per cluster folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.cluster import procs
from ortlab.envvars import cache_dir
from ortlab.errors import OrtlabError
from ortlab.runfolder.processes import process_alive

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


def record_path(folder: Path) -> Path:
    return folder / "head.json"


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """Write the head's record (`record_path`) whole and durably: a `status` never reads half of one."""
    safeio.write_json(folder, record_path(folder).name, record)


def token_path(folder: Path | None = None) -> Path:
    return (folder or cluster_dir()) / "auth_token"


@contextlib.contextmanager
def cluster_lock(folder: Path, wait: bool) -> Iterator[None]:
    """Hold the cluster folder's lock: one `start` or `stop` at a time, so two starts at the same moment make one
    head, not two with one of them unrecorded. Without `wait` a held lock is refused, naming its holder (a
    start waits for its head, up to minutes: the second start is told so rather than kept waiting). The
    lock is the kernel's (flock), so a killed holder releases it."""
    try:
        fd = safeio.open_in(folder, "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except safeio.UnsafePath:
        raise ClusterError(f"{folder / 'lock'} is a link or not a regular file: remove it") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise ClusterError(
                f"another `ortlab cluster start` (pid {holder or '?'}) is starting the local Ray head of {folder}: "
                "wait for it to finish, then see `ortlab cluster status`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def roots(record: dict[str, Any]) -> list[tuple[int, Any]]:
    """(pid, create time) of every process a start recorded, each the first of its session: the worker nodes, then
    the head."""
    return [(n["pid"], n.get("create_time")) for n in record["nodes"]] + [(record["pid"], record.get("create_time"))]


def status(folder: Path | None = None) -> dict[str, Any]:
    """The local head's record, with `running` true only while the recorded process (same PID and create time)
    is alive; the same for each of its worker nodes (`nodes`: only well-formed entries are kept). `leftovers`:
    the PIDs of processes still running in the sessions of a head or node that ended (a killed `ray start` leaves
    Ray's agents behind), for `stop` to end."""

    folder = folder or cluster_dir()
    try:
        record = json.loads(record_path(folder).read_text())
    except (FileNotFoundError, ValueError):
        return {"running": False, "folder": str(folder), "nodes": [], "leftovers": []}
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return {"running": False, "folder": str(folder), "nodes": [], "leftovers": []}
    record["running"] = process_alive(record["pid"], record.get("create_time"))
    nodes = record.get("nodes") if isinstance(record.get("nodes"), list) else []
    record["nodes"] = [
        {**node, "running": process_alive(node["pid"], node.get("create_time"))}
        for node in nodes
        if isinstance(node, dict) and isinstance(node.get("pid"), int) and not isinstance(node["pid"], bool)
    ]
    ended = [(pid, created) for pid, created in roots(record) if not process_alive(pid, created)]
    record["leftovers"] = procs.leftovers(ended) if ended else []
    return record
