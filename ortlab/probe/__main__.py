"""`python -m ortlab.probe --probe GROUP`: one probe group, in the subprocess the doctor started for it."""

import json
import sys

from ortlab.probe.groups import ALL, MARKER, run_probe_group

if len(sys.argv) == 3 and sys.argv[1] == "--probe" and sys.argv[2] in ALL:
    result = run_probe_group(sys.argv[2])
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)
else:
    print(f"usage: python -m ortlab.probe --probe {{{','.join(ALL)}}}", file=sys.stderr)
    sys.exit(2)
