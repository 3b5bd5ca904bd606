"""Whose process a run's status names: alive or not (its pid and create time), and whether it is this run's.

A run folder's status.json records the pid and create time of the process that runs it. Neither proves anything
on its own: a pid is reused after its process ends, and a status file may name any process (a forged or stale
one). `run_process` tells a run's own process from another's by what a run's process always shows: the folder in
its command line, or a file of the folder held open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def process_alive(pid: int, create_time: float | None = None) -> bool:
    """Is `pid` a live (not zombie) process, and the same one that was recorded (not a reused pid)?"""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def run_process(path: Path, status: dict[str, Any]) -> str:
    """Whose is the process a status records: "none" (no pid), "dead" (gone, or its pid reused since), "ours" (a
    live process of this run), or "foreign" (a live process that is not this run's: a forged or hand-edited pid).

    A live pid with the recorded create time is not proof enough: status.json can name any process. A run's own
    process shows it: a worker, torchrun or a remote monitor has the folder in its command line, and every run
    process (an in-process run in a notebook kernel too) holds a file in the folder open (its log or metrics).
    """
    import psutil

    pid, created = status.get("pid"), status.get("create_time")
    if not pid:
        return "none"
    if not process_alive(pid, created):
        return "dead"
    if created is None:
        return "foreign"  # ortlab always records the create time: without it the pid cannot be told from another
    folder = str(path.resolve())
    try:
        proc = psutil.Process(pid)
        if folder in proc.cmdline():
            return "ours"
        inside = folder + os.sep
        return "ours" if any(f.path.startswith(inside) for f in proc.open_files()) else "foreign"
    except psutil.NoSuchProcess:
        return "dead"
    except psutil.Error:
        return "foreign"  # another user's process (AccessDenied): not this run's


def process_create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
