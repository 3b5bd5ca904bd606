"""Ray clusters: the local one ortlab starts, and connecting to any.

ortlab/cluster/head.py     `ortlab cluster start | stop`: the local head (and its worker nodes) on loopback,
                           with token authentication, found and stopped by the PIDs it recorded
ortlab/cluster/record.py   where the local head keeps its record and token; its status; one start at a time
ortlab/cluster/procs.py    every process the local head and its nodes started (their sessions): ended by `stop`
ortlab/cluster/connect.py  which addresses the user's Ray token may go to, and `connect`, whose errors say what
                           to do (unreachable, refused token, Ray not installed)
"""

from ortlab.cluster.connect import (
    ADDRESSES_ENV,
    ALLOW_HTTP_ENV,
    check_transport,
    configured_addresses,
    connect,
    is_configured,
    ray_command,
    resolve_address,
    stop_job,
    token_for,
)
from ortlab.cluster.head import dashboard_is_ours, listeners, start, stop
from ortlab.cluster.record import LOCAL, ClusterError, cluster_dir, status, token_path

__all__ = [
    "ADDRESSES_ENV",
    "ALLOW_HTTP_ENV",
    "LOCAL",
    "ClusterError",
    "check_transport",
    "cluster_dir",
    "configured_addresses",
    "connect",
    "dashboard_is_ours",
    "is_configured",
    "listeners",
    "ray_command",
    "resolve_address",
    "start",
    "status",
    "stop",
    "stop_job",
    "token_for",
    "token_path",
]
