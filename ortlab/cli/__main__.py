"""`python -m ortlab.cli`: the `ortlab` command, in this interpreter."""

from ortlab.cli import main

main()
