"""Driver side: entry point of the local monitor of a Ray job: `python -m ortlab.runner.rayentry monitor RUN ...`.

A module of its own, imported by nothing: running `ortlab.runner.monitor` with `-m` made runpy warn in every
monitor's log ("found in sys.modules after import of package 'ortlab.runner'"), since the package imports the
monitor before `-m` runs it. See `ortlab.runner.monitor` for what it does.
"""

import sys

from ortlab.runner.monitor import main

if __name__ == "__main__":
    sys.exit(main())
