"""Every process the local cluster started, found by session: what `cluster stop` ends and `status` reports.

The head (`ray start --head --block`) and each worker node are started in a session of their own (their PID is
the session ID). Everything Ray starts from them stays in that session: GCS, the dashboard and its modules, each
raylet, its agents and its workers (those take process groups of their own, so ending the head's process group
is not enough, but none of them leaves the session). A parent is no guide: when `ray start` is killed, its
children are handed to PID 1, and two of them (the dashboard agent and the runtime-env agent) keep running with
their listeners. The session is kept, whoever dies first.

A session ID is a PID, so why is it not someone else's session after the head died? Linux does not give a PID to
a new process while any process still uses it as its session (or group) ID. So while one process of the old
session lives, the ID is the old session's; once a process with that PID lives again with another create time
than the one recorded, the old session has no member left, and nothing is ended. Only this user's processes are
ever signalled.

Ray's job drivers start their own sessions; Ray ends each one when its job supervisor (a worker, in the session)
ends. They are also ended here while they are still the supervisor's children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

# How many times `end` looks again for processes started while it was ending the others.
ROUNDS = 5


def session(pid: int, create_time: Any) -> list[Any]:
    """This user's live processes in the session that ortlab started as `pid` (recorded with `create_time`):
    the recorded process itself if it lives, and whatever is left of the session if it died. psutil Processes,
    so a later signal is sent only to the same process (psutil checks its create time first)."""
    import psutil

    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1 or pid == os.getsid(0):
        return []  # (a record is a file: never PID 1's session, nor the caller's own)
    try:
        leader = psutil.Process(pid)
        if create_time is not None and abs(leader.create_time() - float(create_time)) >= 1.0:
            return []  # the PID lives again as another process: the recorded session has ended
    except psutil.NoSuchProcess:
        pass
    except (psutil.Error, TypeError, ValueError):
        return []
    me = os.getuid()
    found = []
    for other in psutil.pids():
        try:
            if os.getsid(other) != pid:
                continue
            proc = psutil.Process(other)
            if proc.uids().real == me and proc.status() != psutil.STATUS_ZOMBIE and other != os.getpid():
                found.append(proc)
        except (OSError, psutil.Error):  # ended meanwhile
            continue
    return found


def leftovers(roots: list[tuple[int, Any]]) -> list[int]:
    """The PIDs of every live process in the sessions of `roots` ((pid, create time) of what ortlab started)."""
    return sorted({proc.pid for pid, created in roots for proc in session(pid, created)})


def end(roots: list[tuple[int, Any]], timeout: float) -> None:
    """End every process of the sessions of `roots`, in order, and the descendants of each (a job's driver).

    Each live root is asked first (SIGTERM to its process group: `ray start --block` and a worker node then stop
    their Ray processes themselves) and waited for up to `timeout`; then whatever is left of the sessions is
    killed (SIGKILL), looking again for processes started meanwhile."""
    import psutil

    for pid, created in roots:
        family = _with_descendants(session(pid, created))
        root = next((proc for proc in family if proc.pid == pid), None)
        if root is not None:
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGTERM)
                else:
                    root.terminate()
            with contextlib.suppress(psutil.Error):
                root.wait(timeout)
        _kill(family)
    for _ in range(ROUNDS):
        family = _with_descendants([proc for pid, created in roots for proc in session(pid, created)])
        if not family:
            return
        _kill(family)


def _with_descendants(procs: list[Any]) -> list[Any]:
    import psutil

    found = {proc.pid: proc for proc in procs}
    for proc in procs:
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.uids().real == os.getuid():
                    found.setdefault(child.pid, child)
    return list(found.values())


def _kill(procs: list[Any]) -> None:
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):  # psutil signals only the same process (PID and create time)
            proc.kill()
    deadline = time.monotonic() + 5.0
    # A killed process whose parent is gone stays a zombie until PID 1 reaps it: dead all the same.
    while time.monotonic() < deadline and any(_alive(proc) for proc in procs):
        time.sleep(0.05)


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
