"""Driver side: entry point of a launched run process: `python -m ortlab.runner.worker RUN_DIR [--resume]`."""

import sys

from ortlab.train.run import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
