"""Driver side: entry point of a launched run process: `python -m ortlab.runner.worker RUN_DIR [--resume] [--base DIR]`.

The process runs in a folder of ortlab's (`ortlab.envvars.child_cwd`), not the caller's: `--base` is the caller's
folder, against which the spec's relative paths (`./train.csv`, `./model`) are read, as they were written.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from ortlab.lifecycle.execute import execute
from ortlab.runfolder.rundir import RunDir
from ortlab.runner.torchrun import join_group


def worker_main(argv: list[str] | None = None) -> int:
    """Train the run in RUN_DIR (its spec.yaml says what), from its last checkpoint with --resume; exit 1 when it
    failed (the run folder's status says why)."""
    p = argparse.ArgumentParser(prog="python -m ortlab.runner.worker")
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


if __name__ == "__main__":
    sys.exit(worker_main())
