"""One worker node of the local head, on this machine: `python -m ortlab.cluster.node GCS --num-cpus N ...`.

Why not `ray start --address=GCS`: Ray refuses to add a node in its local-only mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
=0, which keeps every listener on loopback), and outside that mode it rewrites 127.0.0.1 into the machine's
address, so the node would look for the head, and listen, beyond loopback. A node started the way Ray's own
multi-node tests start theirs (`ray.cluster_utils.Cluster.add_node`: a `ray._private.node.Node` with an explicit
loopback address) keeps local-only mode and joins the head. That is a private Ray API: the head checks every
node's listeners after the start (`head._refuse_exposed`), so a Ray that changes it fails loudly, never opens a port.

The process blocks until SIGTERM (what `ortlab cluster stop` sends its process group), then ends the node's
processes.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ortlab.cluster.node")
    p.add_argument("gcs", help="the head's GCS address (host:port)")
    p.add_argument("--temp-dir", required=True, help="the head's session folder (Ray's --temp-dir)")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    a = p.parse_args(argv)

    import ray._private.node
    import ray._private.parameter

    params = ray._private.parameter.RayParams(
        gcs_address=a.gcs,
        node_ip_address="127.0.0.1",
        temp_dir=a.temp_dir,
        num_cpus=a.num_cpus,
        num_gpus=a.num_gpus,
        include_log_monitor=False,  # one per machine: the head's
        node_manager_port=0,
        min_worker_port=0,
        max_worker_port=0,
        dashboard_agent_listen_port=0,
    )
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"ortlab: worker node {node.node_id} joined {a.gcs}", flush=True)
    done.wait()
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
