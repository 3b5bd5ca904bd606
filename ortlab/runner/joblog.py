"""Driver side: the tail of a Ray job's log, read without holding the whole log: the catch-up after a job ends
(the monitor) and the doctor job's report (`rayjob`) read it here."""

from __future__ import annotations

import threading
from typing import Any

# The catch-up at a job's end reads the log's tail only: at most this many lines of it, and of those at most this
# many bytes (the last ones). The records it may have missed are the last ones; older ones come from the run place.
CATCH_UP_LINES = 5000
CATCH_UP_BYTES = 16 * 1024 * 1024


def job_log_tail(client: Any, job_id: str, lines: int | None = None, limit: int | None = None) -> tuple[str, str]:
    """(the last `lines` lines of a Ray job's log, at most its last `limit` bytes; how it was read, for the run's
    log). Defaults: CATCH_UP_LINES and CATCH_UP_BYTES.

    Ray Jobs' `get_job_logs` sends the whole log in one answer, whatever its size, and the catch-up held all of it
    (twice: the text, then its lines). Ray's log API (`/api/v0/logs/file?submission_id=..&lines=N`, what
    `ray logs job --tail` asks) reads the file's tail on the head; its answer is streamed here and only its last
    `limit` bytes kept. Where that is refused (a head without the log API) or answers nothing, the log's stream
    (`tail_job_logs`, Ray's public client) is read to its end keeping only the last `limit` bytes: the whole log is
    sent, but never held."""
    import asyncio
    from urllib.parse import urlencode

    lines = CATCH_UP_LINES if lines is None else lines
    limit = CATCH_UP_BYTES if limit is None else limit
    kept = bytearray()

    def keep(chunk: bytes) -> None:
        kept.extend(chunk)
        if len(kept) > limit:
            del kept[: len(kept) - limit]

    def text() -> str:
        out = kept.decode("utf-8", errors="replace")
        # A tail cut at `limit` starts inside a line: that piece is dropped, not read as a line.
        return out.split("\n", 1)[1] if len(kept) >= limit and "\n" in out else out

    try:
        query = urlencode({"submission_id": job_id, "lines": lines, "media_type": "file"})
        response = client._do_request("GET", f"/api/v0/logs/file?{query}", stream=True, timeout=60)
        if response.status_code == 200:
            for chunk in response.iter_content(chunk_size=1 << 16):
                keep(chunk)
            # An empty answer is not an empty log: the API answers 200 and nothing while the head's log agent cannot
            # find the job's file yet (seen with a doctor job just ended, on a head just started): ask the stream.
            if kept:
                return text(), f"the last {lines} lines of the job's log (at most {limit} bytes)"
    except Exception:
        kept.clear()

    async def streamed() -> None:
        async for piece in client.tail_job_logs(job_id):
            keep(piece.encode("utf-8", errors="replace"))

    # In a thread of its own: `asyncio.run` refuses to start where an event loop runs already (a notebook's
    # kernel, the Jupyter server), and there the doctor's report came back as nothing.
    failed: list[BaseException] = []

    def read() -> None:
        try:
            asyncio.run(streamed())
        except Exception as e:
            failed.append(e)

    reader = threading.Thread(target=read, name="ortlab-job-log", daemon=True)
    reader.start()
    reader.join()
    if failed:
        return text(), f"the job's log, not read to its end ({type(failed[0]).__name__})"
    return text(), f"the job's log streamed, its last {limit} bytes kept"
