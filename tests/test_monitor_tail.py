"""Issue #48, Low: the monitor's catch-up at a job's end read the job's whole log into memory (`get_job_logs`, one
answer of any size). Now it asks Ray's log API for the tail and keeps at most CATCH_UP_BYTES of it, and says so in the
run's log. No cluster: a client that answers like one (the parts the catch-up talks to)."""

from __future__ import annotations

import json
import tracemalloc

from test_remote import _monitor

from ortlab.job import channel
from ortlab.runner import joblog

NOISE_LINE = b"x" * 1023 + b"\n"


class _Response:
    status_code = 200

    def __init__(self, noise_mib: int, tail: bytes):
        self.noise_mib, self.tail = noise_mib, tail

    def iter_content(self, chunk_size: int):
        for _ in range(self.noise_mib * 1024):  # what every library printed, made here piece by piece
            yield NOISE_LINE
        yield self.tail


class _HugeLog:
    """A job that ended after printing `noise_mib` MiB, then its last records and its final status."""

    def __init__(self, noise_mib: int, tail: bytes):
        self.noise_mib, self.tail, self.asked = noise_mib, tail, []

    def _do_request(self, method: str, endpoint: str, **kwargs):
        self.asked.append(endpoint)
        return _Response(self.noise_mib, self.tail)

    def get_job_logs(self, job_id: str) -> str:
        raise AssertionError("the whole log was asked for")

    def get_job_info(self, job_id: str):
        raise ConnectionError("not asked in this test")


def test_the_catch_up_reads_only_the_tail_of_a_huge_log(tmp_path, monkeypatch):
    monitor, local = _monitor(tmp_path)
    monkeypatch.setattr(joblog, "CATCH_UP_BYTES", 1 << 20)
    records = [
        channel.METRIC_TAG + json.dumps({"seq": i, "record": {"event": "step", "step": i + 1}}) for i in range(3)
    ]
    final = channel.FINAL_TAG + json.dumps({"state": "completed", "step": 3})
    client = _HugeLog(64, ("\n".join([*records, final]) + "\n").encode())
    tracemalloc.start()
    try:
        monitor.finish("SUCCEEDED", client, "")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    status = local.read_status()
    assert status["state"] == "completed", status
    assert [r["step"] for r in local.metrics()] == [1, 2, 3]
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held for a 64 MiB log (the tail kept is 1 MiB)"
    assert any("submission_id=job-1" in e and f"lines={joblog.CATCH_UP_LINES}" in e for e in client.asked)
    assert "caught up from the last 5000 lines of the job's log (at most 1048576 bytes)" in local.log_path.read_text()


class _StreamOnly:
    """A head without the log API: only the log's stream, read to its end."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def _do_request(self, method: str, endpoint: str, **kwargs):
        raise ConnectionError("404: no such route")

    async def tail_job_logs(self, job_id: str):
        for piece in self.pieces:
            yield piece


def test_without_the_log_api_the_stream_is_read_keeping_only_its_end():
    pieces = ["a cut line's start " * 10 + "\n", "early line\n" * 1000, "last line\n"]
    text, how = joblog.job_log_tail(_StreamOnly(pieces), "job-1", limit=100)
    assert len(text.encode()) <= 100 and "cut line" not in text and text.startswith("early line\n")
    assert how == "the job's log streamed, its last 100 bytes kept"


class _EmptyAnswer(_StreamOnly):
    """A head whose log API answers 200 and nothing (its log agent cannot find the job's file yet)."""

    def _do_request(self, method: str, endpoint: str, **kwargs):
        return _Response(0, b"")


def test_an_empty_answer_of_the_log_api_is_asked_again_from_the_stream():
    """The doctor's report on a head just started: the log API found no file and said nothing, and the report was
    "could not run" with no line to show; the stream has the log."""
    report = channel.DOCTOR_TAG + "{}\n"
    text, how = joblog.job_log_tail(_EmptyAnswer(["starting\n", report]), "job-1", lines=10, limit=1 << 20)
    assert text == "starting\n" + report and "streamed" in how


def test_the_stream_is_read_where_an_event_loop_runs_already():
    """A notebook's kernel runs an event loop: `asyncio.run` refused there, and the doctor's report came back empty
    (the cluster notebook failed with "ortlab's doctor could not run")."""
    import asyncio

    async def in_a_kernel() -> tuple[str, str]:
        return joblog.job_log_tail(_EmptyAnswer(["a\n", "b\n"]), "job-1", lines=10, limit=1 << 20)

    loop = asyncio.new_event_loop()  # (not asyncio.run: it would leave this thread with no event loop set)
    try:
        text, how = loop.run_until_complete(in_a_kernel())
    finally:
        loop.close()
    assert text == "a\nb\n" and "streamed" in how
