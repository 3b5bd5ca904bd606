"""A run process on this machine: `python -m ortlab.lifecycle RUN_DIR [--resume] [--base DIR]`.

What the local launcher (`ortlab.runner.local`) starts, alone or once per rank under torchrun: it joins the run's
process group when torchrun started it (`join_group`), then trains the run folder (`ortlab.lifecycle.execute`). It
is the run's own process, so it lives with the run's lifecycle, not with the driver that launched it. A module of
its own, imported by nothing: running a module that its package already imported makes runpy warn in every run's
log ("found in sys.modules after import of package").

The process runs in a folder of ortlab's (`ortlab.envvars.child_cwd`), not the caller's: `--base` is the caller's
folder, against which the spec's relative paths (`./train.csv`, `./model`) are read, as they were written.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

from ortlab.lifecycle.execute import execute
from ortlab.netutil import GROUP_SECRET_ENV, secret_store
from ortlab.runfolder.rundir import RunDir

# How long a collective may wait before the group fails: transformers' default (`ddp_timeout`), which its own
# `env://` set-up would have used.
GROUP_TIMEOUT = timedelta(seconds=1800)


def main(argv: list[str] | None = None) -> int:
    """Train the run in RUN_DIR (its spec.yaml says what), from its last checkpoint with --resume; exit 1 when it
    failed (the run folder's status says why)."""
    p = argparse.ArgumentParser(prog="python -m ortlab.lifecycle")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--base", default=None, help="the folder the spec's relative paths are relative to")
    a = p.parse_args(argv)
    run = RunDir(a.run_dir)
    try:
        join_group()  # (under torchrun: the run's group, its keys under the run's secret)
        execute(run, resume=a.resume, progress=False, base=a.base)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def join_group() -> None:
    """In a rank that torchrun started here (`ortlab.runner.torchrun`, its store on loopback): join the run's process
    group through the store's secret prefix (nccl where CUDA is visible, as transformers would choose, else gloo).
    transformers, Accelerate and DeepSpeed find the group made and use it. Nothing to do in a process that torchrun
    did not start."""
    secret = os.environ.pop(GROUP_SECRET_ENV, None)  # (the worker's own children have no use for it)
    if secret is None or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, False, GROUP_TIMEOUT, use_libuv=False
    )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend, store=secret_store(client, secret), rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT
    )


if __name__ == "__main__":
    sys.exit(main())
