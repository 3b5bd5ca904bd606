"""Where the suite's time goes: seconds per test file and per xdist worker, printed after the run and written to
test-artifacts/suite-times.json (issue #47: CI from a fresh clone in 30 minutes needs to know what to cut).

A file's time is the sum of its tests' set-up, call and tear-down phases, so a session fixture built in a file's
first test counts there (a fixture built on both workers shows as set-up time in two files). A worker's busy time
against the session's wall time says how well `--dist loadgroup` balanced the two: the idle share is time one
core spent waiting for the other's last group.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


class SuiteTimes:
    """A pytest plugin on the controller process (under xdist, the reports of both workers reach it)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.started = time.monotonic()
        self.by_file: dict[str, float] = defaultdict(float)
        self.by_worker: dict[str, float] = defaultdict(float)
        self.worker_of: dict[str, str] = {}
        self.setups: list[tuple[float, str]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        path = report.nodeid.split("::", 1)[0]
        worker = getattr(getattr(report, "node", None), "gateway", None)
        worker_id = getattr(worker, "id", "main")
        self.by_file[path] += report.duration
        self.by_worker[worker_id] += report.duration
        self.worker_of[path] = worker_id
        if report.when == "setup" and report.duration > 5:
            self.setups.append((report.duration, report.nodeid))

    def summary(self) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        files = sorted(self.by_file.items(), key=lambda kv: -kv[1])
        return {
            "wall_s": round(wall, 1),
            "workers": {
                w: {"busy_s": round(s, 1), "idle_share": round(max(0.0, 1 - s / wall), 3)}
                for w, s in sorted(self.by_worker.items())
            },
            "files": [{"file": f, "s": round(s, 1), "worker": self.worker_of.get(f, "")} for f, s in files],
            "slow_setups": [{"nodeid": n, "s": round(s, 1)} for s, n in sorted(self.setups, reverse=True)[:15]],
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        data = self.summary()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(data, indent=1) + "\n")
        write = terminalreporter.write_line
        write(f"where the suite's time went ({self.out.relative_to(self.out.parent.parent)}):")
        for w, v in data["workers"].items():
            write(
                f"  worker {w}: busy {v['busy_s'] / 60:.1f} min of {data['wall_s'] / 60:.1f} "
                f"(idle {v['idle_share']:.0%})"
            )
        for row in data["files"][:15]:
            write(f"  {row['s']:7.1f} s  {row['worker']:<4} {row['file']}")
