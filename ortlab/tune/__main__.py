"""`python -m ortlab.tune CONFIG`: one candidate's process (see `ortlab.tune.child`); the driver starts it."""

import sys

from ortlab.tune.child import _candidate_main

if __name__ == "__main__":
    sys.exit(_candidate_main(sys.argv[1]))
