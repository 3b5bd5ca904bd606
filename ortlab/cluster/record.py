"""Where the local head keeps its record and token, and its status: what both starting a head and connecting to
one read (`ortlab.cluster`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ortlab.envvars import cache_dir
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


def record_path(folder: Path) -> Path:
    return folder / "head.json"


def token_path(folder: Path | None = None) -> Path:
    return (folder or cluster_dir()) / "auth_token"


def status(folder: Path | None = None) -> dict[str, Any]:
    """The local head's record, with `running` true only while the recorded process (same PID and create time)
    is alive; the same for each of its worker nodes (`nodes`: only well-formed entries are kept)."""
    from ortlab.runfolder.rundir import process_alive

    folder = folder or cluster_dir()
    try:
        record = json.loads(record_path(folder).read_text())
    except (FileNotFoundError, ValueError):
        return {"running": False, "folder": str(folder), "nodes": []}
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return {"running": False, "folder": str(folder), "nodes": []}
    record["running"] = process_alive(record["pid"], record.get("create_time"))
    nodes = record.get("nodes") if isinstance(record.get("nodes"), list) else []
    record["nodes"] = [
        {**node, "running": process_alive(node["pid"], node.get("create_time"))}
        for node in nodes
        if isinstance(node, dict) and isinstance(node.get("pid"), int) and not isinstance(node["pid"], bool)
    ]
    return record
