"""Job side: the process group of a run's Ray Train workers, its rendezvous store bound to one address.

Ray Train's own set-up (`TorchConfig`) starts the group with `init_process_group("env://")` towards a free port of
rank 0's node, so torch starts the group's store in rank 0 bound to every interface of that machine (torch binds a
TCPStore to all of them whatever address it is given), with no authentication: anyone who reaches the machine could
read and write its keys. Ray Train has no setting for the address the store binds.

`BoundTorchConfig` is Ray's `TorchConfig` with one change to its set-up: rank 0 hosts the store on a socket it binds
itself (`netutil.bound_store`), and every rank joins the group through that store (`init_process_group(store=)`):

- every worker on one machine (the local head's nodes included: they are all 127.0.0.1): 127.0.0.1;
- workers on several machines: rank 0's address in the cluster, the one Ray itself uses for that node
  (`ray.util.get_node_ip_address()`), not the machine's other interfaces.

Whoever can reach that address (a local user, for loopback) can still connect to the store; the group's keys live
under a secret the driver makes for each start of the group and hands the ranks through Ray's own calls
(`netutil.secret_store`), so they cannot name, read or overwrite them.

gloo's own sockets are pinned the same way (GLOO_SOCKET_IFNAME: `lo`, or the interface that holds the worker's node
address), unless the environment names an interface already. NCCL (GPU workers) picks its bootstrap interface
itself (NCCL_SOCKET_IFNAME): this module does not change it (see docs/guide/clusters.md).

The backend subclasses Ray Train's private `_TorchBackend` (its shutdown and other hooks are kept) and replaces
only `on_start`, written for Ray Train v2 (Ray's default); the Ray Train test lists the workers' listeners while
they train, so a Ray that sets the group up differently fails there.

This module imports Ray and torch at the top: only the job's driver and its workers load it.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from typing import Any

import psutil
import ray
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

from ortlab.netutil import LOOPBACK, LOOPBACK_INTERFACE, bound_store, secret_store

# Rank 0's store server, held for the life of its worker process (a group started again is a new process).
_hosted: list[Any] = []


def _node_address() -> str:
    return ray.util.get_node_ip_address()


def _host_store(host: str, world_size: int, timeout_s: int) -> int:
    """On rank 0: start the group's store on `host`; returns its port."""
    store, port = bound_store(host, world_size, timedelta(seconds=timeout_s))
    _hosted[:] = [store]
    return port


def _interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds `address`, if one does."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    return None


def _join(backend: str, rank: int, world_size: int, host: str, port: int, timeout_s: int, secret: str) -> None:
    """On every rank: join the group through the store on host:port (rank 0 through the one it hosts), every key
    under `secret`."""
    import torch.distributed as dist

    interface = LOOPBACK_INTERFACE if host == LOOPBACK else _interface_of(_node_address())
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    if backend == "nccl":  # as Ray's own set-up: a timed-out collective fails instead of hanging
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # DeepSpeed and Accelerate read these; the group already exists, so neither starts another.
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    timeout = timedelta(seconds=timeout_s)
    store = _hosted[0] if rank == 0 else dist.TCPStore(host, port, world_size, False, timeout)
    dist.init_process_group(
        backend, store=secret_store(store, secret), rank=rank, world_size=world_size, timeout=timeout
    )


class _BoundTorchBackend(_TorchBackend):
    def on_start(self, worker_group: Any, backend_config: TorchConfig) -> None:
        backend = backend_config.backend or "gloo"
        addresses = worker_group.execute(_node_address)
        host = LOOPBACK if len(set(addresses)) == 1 else addresses[0]
        port = worker_group.execute_single(0, _host_store, host, len(worker_group), backend_config.timeout_s)
        secret = secrets.token_hex(16)
        worker_group.execute(_set_torch_distributed_env_vars)  # (RANK, LOCAL_RANK, ...: Ray Train v2 sets them here)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank, _join, backend, rank, len(worker_group), host, port, backend_config.timeout_s, secret
                )
                for rank in range(len(worker_group))
            ]
        )


class BoundTorchConfig(TorchConfig):
    """Ray Train's TorchConfig whose group's store listens on loopback (one machine) or rank 0's cluster address."""

    @property
    def backend_cls(self) -> type:
        return _BoundTorchBackend
