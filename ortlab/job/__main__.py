"""Job side: what a launcher submits to a cluster: `python -m ortlab.job worker|doctor|raytrain ...`.

A module of its own, imported by nothing: running a module that its package already imported made runpy warn in
every job's log ("found in sys.modules after import of package"). Ray is imported only by `raytrain`, the Ray Train
driver (and its workers, which unpickle the loop from `ortlab.job.raytrain`).
"""

from __future__ import annotations

import argparse
import sys

from ortlab.job.channel import doctor_main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ortlab.job")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="train a run place in one process, its records printed for the monitor")
    w.add_argument("run_dir", help="the run place: a shared folder's path, or an object store URI")
    w.add_argument("--resume", action="store_true")
    t = sub.add_parser("raytrain", help="drive a Ray Train run of a run place across target.processes workers")
    t.add_argument("run_dir", help="the run place: a shared folder's path, or an object store URI")
    t.add_argument("--resume", action="store_true")
    d = sub.add_parser("doctor", help="this node's doctor report and the cluster's resources, printed tagged")
    d.add_argument("--storage", help="an object store URI to write and read a probe object in")
    a = p.parse_args(argv)
    if a.command == "worker":
        from ortlab.job.channel import job_worker_main

        return job_worker_main(a.run_dir, a.resume)
    if a.command == "raytrain":
        from ortlab.job.raytrain import main as raytrain_main

        return raytrain_main(a.run_dir, a.resume)

    return doctor_main(a.storage)


if __name__ == "__main__":
    sys.exit(main())
