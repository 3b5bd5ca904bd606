"""The cluster's live view through object storage (issue #31 item 7): a Ray Train run's records reach the local run
folder by the short way, rank 0's push and the monitor's own read of the store, not only through the job's log.

No cluster: rank 0's side is a real `Mirror` keeping a real stream in step with a real S3-protocol server (conftest's
`s3_store`), and the driver's side is the real `RayJobMirror.follow` loop, given a stand-in for the Ray Jobs client
whose log the test feeds by hand (so it can stay silent, or bring records the store has not got yet).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import ortlab
from ortlab.job import channel
from ortlab.job.mirror import Mirror
from ortlab.runfolder.objstore import Store, StoredRun
from ortlab.runfolder.place import bind
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import monitor as raymonitor
from ortlab.wire import LIVE_S


class HandFedJob:
    """What the monitor asks a Ray Jobs client, for a job that runs until `end()`: its log is what the test `say`s."""

    def __init__(self):
        self.lines: list[str] = []
        self.ended = threading.Event()

    def say(self, *lines: str) -> None:
        self.lines += [line + "\n" for line in lines]

    def end(self) -> None:
        self.ended.set()

    def get_job_status(self, job_id: str):
        class State:
            value = "SUCCEEDED" if self.ended.is_set() else "RUNNING"

        return State()

    async def tail_job_logs(self, job_id: str):
        """As Ray's: the log from its start, followed until the job ends, then the rest and the stream closes."""
        sent = 0
        while not self.ended.is_set():
            while sent < len(self.lines):
                sent += 1
                yield self.lines[sent - 1]
            await asyncio.sleep(0.02)
        for line in self.lines[sent:]:
            yield line

    def get_job_logs(self, job_id: str) -> str:
        return "".join(self.lines)

    def get_job_info(self, job_id: str):
        raise ConnectionError("not asked in this test")


class Counting:
    """A pyarrow file system that counts the calls made through it (the store's requests), passing each on."""

    def __init__(self, fs):
        self.fs, self.calls = fs, []

    def __getattr__(self, name):
        method = getattr(self.fs, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


def step(n: int) -> bytes:
    return json.dumps({"event": "step", "step": n, "time": time.time()}).encode() + b"\n"


def tagged(seq: int, n: int) -> str:
    return channel.METRIC_TAG + json.dumps({"seq": seq, "record": {"event": "step", "step": n}})


def local_steps(local: RunDir) -> list[int]:
    return [r["step"] for r in local.metrics() if r.get("event") == "step"]


def wait_until(what, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"waited in vain: {what.__doc__ or ''}"
        time.sleep(0.02)


def test_a_ray_train_runs_records_come_home_from_the_store_while_the_jobs_log_is_silent(s3_store, tmp_path):
    """Rank 0's stream reaches the local folder through the store alone: the job's log says nothing, and rank 0's
    status and controls are stuck behind a store request that does not return (so a push that waited its turn
    behind them, as one thread did before, would never come). Then the log brings the same records again, and one
    the store has not got yet: each is written once, in order, and the store's copy of that one is not written
    again. A short burst is pushed at most once per LIVE_S, and the monitor's read that finds nothing new is one
    request."""
    stored = StoredRun(Store(s3_store).child("live"))
    stored.create(b"name: live\n")
    local = RunDir(tmp_path / "local" / "live")
    (local.path / "logs").mkdir(parents=True)
    launcher = {"kind": "ray-train", "cluster": "local", "job_id": "job-1", "storage": stored.path}
    local.status_path.write_text(json.dumps({"state": "running", "launcher": launcher}))
    spec = ortlab.RunSpec(target={"cluster": "local", "storage": s3_store, "processes": 2})
    local.spec_path.write_text(spec.to_yaml())
    bind(stored, local)  # (what the launch does: the place is this folder's, `place.place_in`)

    rank0 = Mirror(stored, RunDir(tmp_path / "rank0" / "live"), checkpoints=False, metrics_every=LIVE_S)
    rank0.pull(resume=False)
    stuck, released = threading.Event(), threading.Event()

    def controls_stuck() -> None:  # a store request that hangs (a slow store, a lost connection)
        stuck.set()
        released.wait(120)

    rank0.pull_controls = controls_stuck
    puts = []
    put = rank0.place.store.put
    rank0.place.store.put = lambda folder, rel: (puts.append(rel), put(folder, rel))[1]

    job = HandFedJob()
    monitor = raymonitor.RayJobMirror(local.path, "local")
    monitor.connect = lambda: job
    following = threading.Thread(target=monitor.follow)
    try:
        follow_and_check(rank0, monitor, job, local, puts, stuck, released, following)
    finally:
        released.set()
        job.end()
    following.join(60)
    assert not following.is_alive()
    assert local_steps(local) == list(range(1, 105)), "every step once, in order, after the catch-up too"
    assert local.read_status()["state"] == "completed"


def follow_and_check(rank0, monitor, job, local, puts, stuck, released, following) -> None:
    with rank0.syncing():
        following.start()
        stuck.wait(30)
        assert stuck.is_set(), "rank 0's status and controls are stuck from here on"
        with rank0.local.metrics_path.open("ab", buffering=0) as stream:
            for n in (1, 2, 3):
                stream.write(step(n))
                wait_until(lambda n=n: local_steps(local) == list(range(1, n + 1)))
            assert not job.lines and not released.is_set(), "home through the store alone"

            # A burst (one record every 10 ms for about a second): at most one push per LIVE_S, not one per record.
            before, began = len(puts), time.monotonic()
            for n in range(4, 104):
                stream.write(step(n))
                time.sleep(0.01)
            wait_until(lambda: local_steps(local)[-1:] == [103])
            took = time.monotonic() - began
            pushes = len([p for p in puts[before:] if p == "metrics.jsonl"])
            assert 1 <= pushes <= took / LIVE_S + 2, (pushes, took)

            # The log brings what the store brought (nothing twice), then a record the store has not got yet.
            job.say(*(tagged(i, i + 1) for i in range(103)), tagged(103, 104))
            wait_until(lambda: local_steps(local)[-1:] == [104])
            stream.write(step(104))  # (rank 0 writes it, pushes it, the monitor reads it: already here)
            wait_until(lambda: monitor.live.seq == 104)
        reads = Counting(monitor.live.stream.store.fs)
        monitor.live.stream.store.fs = reads
        monitor.live.read()
        assert reads.calls == ["open_input_file"], "nothing new: one request (its HEAD), no read"
        monitor.live.stream.store.fs = reads.fs
        released.set()
    job.say(channel.FINAL_TAG + json.dumps({"state": "completed", "step": 104}))
