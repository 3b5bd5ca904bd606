"""Driver side: torchrun with its rendezvous store on loopback (`python -m ortlab.runner.torchrun ARGS...`).

A run of several processes on this machine starts under torchrun. torchrun's agent hosts the rendezvous store, a
TCPStore that the workers' process group shares too (`TORCHELASTIC_USE_AGENT_STORE`). torch binds that store to
every interface, whatever address it is given (`--master_addr=127.0.0.1` included; torch 2.6 and 2.13, libuv and
legacy backends alike), and the store has no authentication: anyone who reaches the machine could read and write
its keys, and so join or derail the group. A TCPStore also accepts a socket that is already listening
(`master_listen_fd`), and torchrun takes rendezvous backends of other names (`rendezvous_handler_registry`): this
module registers `ortlab-loopback`, torch's static rendezvous with its store on a socket bound here to 127.0.0.1, on
a port the OS picks at bind time (no window between picking a port and binding it), then runs torchrun itself.

torch 2.6's libuv store cannot start from a socket (NotImplementedError), so the store is the legacy one: it only
carries the rendezvous and the process group's set-up, never the tensors (gloo's own sockets do, pinned to the
loopback interface by `GLOO_SOCKET_IFNAME`, see `ortlab.envvars.child_env`). One machine only: there is no second
node to reach a loopback store, so the backend refuses any other node count.

Loopback still lets any local user connect. So the store's keys, the agent's and the workers' alike, live under the
run's secret (`netutil.secret_store`): the agent makes it and its workers inherit it in their environment, and each
worker joins the group itself through that prefix (`join_group` in `ortlab.lifecycle.__main__`, the run process's
entry, before transformers would join it through torch's `env://`, whose keys have fixed names such as
`default_pg/0//cpu//0/0`, the gloo addresses of rank 0).
"""

from __future__ import annotations

import sys
from typing import Any

from ortlab.netutil import LOOPBACK, bound_store, group_secret, secret_store

BACKEND = "ortlab-loopback"


def _create_handler(params: Any) -> Any:
    """torchrun's rendezvous handler for `--rdzv-backend=ortlab-loopback`: the static one, its store on loopback."""
    from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousStoreInfo
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    if params.min_nodes != 1 or params.max_nodes != 1:
        raise ValueError(f"the {BACKEND} rendezvous serves one machine only (--nnodes=1)")

    class LoopbackRendezvous(StaticTCPRendezvous):
        loopback: tuple[Any, int] | None = None  # (store, port), made at the first rendezvous

        def get_backend(self) -> str:
            return BACKEND

        def next_rendezvous(self) -> Any:
            if self.loopback is None:
                self.loopback = bound_store(LOOPBACK, self.world_size, self.timeout)
            store, port = self.loopback
            return RendezvousInfo(
                secret_store(store, group_secret()), self.rank, self.world_size, RendezvousStoreInfo(LOOPBACK, port)
            )

    timeout = int(params.config.get("timeout", 600))
    return LoopbackRendezvous(LOOPBACK, 0, 0, 1, params.run_id, timeout)


def main(argv: list[str]) -> None:
    """Run torchrun with `argv`, its rendezvous on the `ortlab-loopback` backend."""
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)
    group_secret()  # made here, in the environment torchrun hands its workers
    run.main([f"--rdzv-backend={BACKEND}", f"--rdzv-endpoint={LOOPBACK}:0", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
