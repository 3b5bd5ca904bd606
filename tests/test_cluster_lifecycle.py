"""The local cluster's lifecycle: one head per cluster folder, `stop` ends every process the head started whichever
died first, and the node-local copies of runs stay private to their user.

One real head, in a folder of the test's own (never `ray stop`, which ends every Ray process on the machine): in the
cluster's xdist group, so that it does not start beside the session's cluster on the same cores.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from ortlab import cluster, safeio
from ortlab.cluster import head as cluster_head
from ortlab.job import mirror as objsync


def listening_ports(proc: psutil.Process) -> set[int]:
    """The ports `proc` listens on; none for a process that ended meanwhile (Ray's short-lived helpers come and go
    while the head starts up)."""
    try:
        return {c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return set()


def heads_listeners(ports: set[int], session: int, temp_dir: str) -> list[tuple[int, int, str]]:
    """(port, pid, command) of what still listens on one of the head's former `ports` and is the head's: in its
    session (`ortlab cluster start` starts it in one of its own), or a Ray process of its temp folder. Another
    process that took a freed port number since (the suite runs other servers and clusters meanwhile) is not."""
    found = []
    for c in psutil.net_connections(kind="inet"):
        if c.status != "LISTEN" or c.laddr.port not in ports or c.pid is None:
            continue
        try:
            proc = psutil.Process(c.pid)
            command = " ".join(proc.cmdline())
            ours = os.getsid(c.pid) == session or temp_dir in command
        except (psutil.Error, OSError):
            continue
        if ours:
            found.append((c.laddr.port, c.pid, command[:200]))
    return found


def heads_of(folder: Path) -> list[psutil.Process]:
    """Every GCS server of this user started for `folder` (one per head: it runs with the folder's token file),
    read from the processes themselves rather than from ortlab's record."""
    token = str(folder / "auth_token")
    found = []
    for proc in psutil.process_iter(["name", "uids"]):
        if proc.info["name"] != "gcs_server" or proc.info["uids"].real != os.getuid():
            continue
        try:
            if proc.environ().get("RAY_AUTH_TOKEN_PATH") == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("ray-cluster")
def test_one_head_per_folder_and_stop_ends_everything_after_ray_start_was_killed(tmp_path, monkeypatch):
    """Two starts at the same moment: the first, past its look for a running head, is held there until the second
    has been answered; the second is refused, and one head runs. Then its `ray start` is killed (SIGKILL): Ray's
    agents outlive it, with their listeners; `status` names them and `stop` ends every process of the head."""
    folder = tmp_path / "cluster"
    inside, answered = threading.Event(), threading.Event()
    real = cluster_head._ray_program

    def held(*args):
        if threading.current_thread() is first:
            inside.set()
            answered.wait()
        return real(*args)

    monkeypatch.setattr(cluster_head, "_ray_program", held)
    started: dict = {}
    first = threading.Thread(target=lambda: started.update(cluster.start(folder, num_cpus=1, timeout=120)))
    first.start()
    try:
        assert inside.wait(120), "the first start reached the launch"
        with pytest.raises(cluster.ClusterError, match=rf"another `ortlab cluster start` \(pid {os.getpid()}\)"):
            cluster.start(folder, num_cpus=1, timeout=120)
        answered.set()
        first.join()
        assert started.get("running"), "the first start made the head"
        gcs = heads_of(folder)
        assert len(gcs) == 1, f"one head for the folder, not {len(gcs)}"
        assert gcs[0].pid in {p.pid for p in psutil.Process(started["pid"]).children(recursive=True)}

        root = psutil.Process(started["pid"])
        family = [root, *root.children(recursive=True)]
        ports = {port for p in family for port in listening_ports(p)}
        assert ports
        os.kill(root.pid, signal.SIGKILL)
        root.wait(30)  # (a child of this process: reaped here)

        record = cluster.status(folder)
        assert not record["running"]
        left = set(record["leftovers"])
        assert left and left <= {p.pid for p in family}, "status names the processes the head left running"
        from typer.testing import CliRunner

        from ortlab.cli import app

        monkeypatch.setenv("ORTLAB_CLUSTER_DIR", str(folder))
        out = CliRunner().invoke(app, ["cluster", "status"])
        assert out.exit_code == 1 and "still running" in out.output and "ortlab cluster stop" in out.output

        assert cluster.stop(folder), "what was left of the head was running"
        survivors = [(p.pid, p.name()) for p in family if alive(p)]
        assert not survivors, survivors
        left = heads_listeners(ports, started["pid"], started["temp_dir"])
        assert not left, f"no listener of the head is left: {left}"
        assert cluster.status(folder)["leftovers"] == [] and not cluster.stop(folder)
        assert not Path(started["temp_dir"]).exists()
    finally:
        answered.set()
        first.join()
        cluster.stop(folder)


def test_node_local_copies_are_private_and_a_planted_parent_is_refused(tmp_path, monkeypatch):
    """A job's node-local copy of a run lives in this user's 0700 folder under the temp folder: made so, fixed to
    0700 where nobody else could write into it, and refused when it is a link, another user's, or writable by
    others (each of which let another local user read or replace the copies)."""
    me = os.getuid()

    def temp(name: str) -> Path:
        place = tmp_path / name
        place.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(place))
        return place / f"ortlab-jobs-{me}"

    top = temp("fresh")
    run = objsync.node_folder(SimpleNamespace(id="run-1"))
    info = top.lstat()
    assert objsync.jobs_dir() == top and stat.S_ISDIR(info.st_mode) and info.st_uid == me
    assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert run.path.parent.parent == top and stat.S_IMODE(run.path.parent.stat().st_mode) == 0o700

    top = temp("readable")  # ours, readable by others, writable by nobody else: made private
    top.mkdir(mode=0o755)
    os.chmod(top, 0o755)
    assert objsync.jobs_dir() == top and stat.S_IMODE(top.stat().st_mode) == 0o700

    top = temp("writable")  # anyone could have put links of theirs in it
    top.mkdir()
    os.chmod(top, 0o777)
    with pytest.raises(safeio.UnsafePath, match=r"can be written by other users \(mode 777\)"):
        objsync.node_folder(SimpleNamespace(id="run-1"))
    assert stat.S_IMODE(top.stat().st_mode) == 0o777 and not list(top.iterdir())

    top = temp("linked")
    target = tmp_path / "someone-elses"
    target.mkdir(mode=0o755)
    top.symlink_to(target)
    with pytest.raises(safeio.UnsafePath, match=r"is a link or not a folder"):
        objsync.jobs_dir()
    assert not list(target.iterdir()) and stat.S_IMODE(target.stat().st_mode) == 0o755

    top = temp("theirs")
    if me == 0:
        top.mkdir(mode=0o700)
        os.chown(top, 65534, 65534)
    else:  # (only root can give a folder away: here this user's folder is looked at as another user's)
        monkeypatch.setattr(os, "getuid", lambda: me + 1)
        (top.parent / f"ortlab-jobs-{me + 1}").mkdir(mode=0o700)
    with pytest.raises(safeio.UnsafePath, match=r"belongs to another user"):
        objsync.jobs_dir()
