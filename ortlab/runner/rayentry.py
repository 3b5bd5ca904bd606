"""Entry point of both ends of a Ray job's channel: `python -m ortlab.runner.rayentry worker|monitor|doctor ...`.

A module of its own, imported by nothing: `python -m ortlab.runner.raychannel` made runpy warn in every job's and
monitor's log ("found in sys.modules after import of package 'ortlab.runner'"), since the package imports the
channel before `-m` runs it. See `ortlab.runner.raychannel` for what each command does.
"""

import sys

from ortlab.runner.raychannel import main

if __name__ == "__main__":
    sys.exit(main())
