"""Driver side: a Ray Train run's stream read straight from its run place, the short way home for the monitor.

The job's log is the one channel every Ray cluster offers (`ortlab.job.channel`), but for a Ray Train run it is the
long way round: rank 0 pushes its stream to the store, the job's driver pulls it from there and prints it, Ray's
job agent looks at the job's log once a second, and only then does the monitor's log tail see the line. The
monitor can read the run place itself (it brings the results home from there anyway), so it reads the stream
there too, every `LIVE_S`: one HEAD when nothing was added, a ranged read of the new part when something was.
Both ways number a record by its index among the stream's records (read by the same bounded reader), and the
monitor writes each number once, whichever way brought it first (`RayJobMirror._append`); one way that drops a record
is covered by the other, and by the catch-up from the place when the job ends.
"""

from __future__ import annotations

import threading
from typing import Any

from ortlab.runfolder.place import RunPlace
from ortlab.wire import LIVE_S

Numbered = list[tuple[int, dict[str, Any]]]


class LiveStream:
    """The run place's metrics stream, followed from its start; `read` (in a thread: a store's requests block)
    keeps what it finds for `take` (on the monitor's own thread, where the log's records are written too)."""

    def __init__(self, place: RunPlace):
        self.place = place
        self.stream = place.follow(on_restart=self._restarted)
        self.seq = 0  # the sequence number of the place's next record
        self.kept: Numbered = []
        self.lock, self.reading = threading.Lock(), threading.Lock()
        self.problem: str | None = None

    def read(self) -> None:
        if not self.reading.acquire(blocking=False):
            return  # (one read at a time: a read left running by a closed tail finishes on its own)
        try:
            got = self.stream.read()  # (bounded: at most CHUNK_BYTES a call, lines within the reader's limit)
            with self.lock:
                for record in got:
                    self.kept.append((self.seq, record))
                    self.seq += 1
        finally:
            self.reading.release()

    def _restarted(self) -> None:
        with self.lock:  # (the stream was replaced or cut: its records are numbered from 0 again)
            self.kept, self.seq = [], 0

    def take(self) -> Numbered:
        """What `read` found since the last `take`, in order."""
        with self.lock:
            got, self.kept = self.kept, []
        return got

    async def follow(self, take: Any, say: Any) -> None:
        """Every LIVE_S: `read` in a thread, then `take(records)`. A failed read (a store hiccup) is passed to
        `say` once per kind of failure (the job's log still brings the records) and tried again next time."""
        import asyncio

        while True:
            await asyncio.sleep(LIVE_S)
            try:
                await asyncio.to_thread(self.read)
            except Exception as e:
                problem = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                if problem != self.problem:
                    self.problem = problem
                    say(f"[ortlab monitor] reading the stream from {self.place.path} failed: {problem}")
            take(self.take())
