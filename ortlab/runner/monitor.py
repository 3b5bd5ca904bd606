"""Driver side: the local monitor of a Ray job: reads the job's log, mirrors the run into its local run folder.

    local run folder (what Run, follow, export, the workbench read)       the run place (both sides use it)
      spec.yaml, status.json  <- mirrored by the monitor                    <storage>/<run id>/: a shared folder
      metrics.jsonl           <- appended by the monitor, in order,         or a stored run (`runfolder.place`),
                                 each record once (by sequence number)       written by the job (the source of truth)
      model/, result.json, checkpoints/  <- brought home when the job ends
      control/stop, control/pause  -> forwarded to the run place

The monitor (`python -m ortlab.runner.rayentry monitor RUN --cluster ADDRESS`, detached, its PID recorded in
status.json like a local worker's) tails the job's log stream for the lines the job's end prints
(`ortlab.job.channel`), appends the records it has not got yet, mirrors the job's state, forwards stop and pause,
and brings the results home (`runfolder.place.bring_home`). A Ray Train run's records are also read from the run
place itself, the shorter way home (`ortlab.runner.livestream`); each is written once, whichever way came first.
The launcher that submits the job and starts the monitor is `ortlab.runner.rayjob`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from ortlab import cluster
from ortlab.runfolder import events
from ortlab.runfolder.place import RunPlace, RunStorage, bring_home, place_in, storage_at
from ortlab.runfolder.rundir import TERMINAL, RunDir, RunStateError, pause_step, read_metrics
from ortlab.runner.joblog import job_log_tail
from ortlab.runner.launcher import RunError
from ortlab.runner.livestream import LiveStream
from ortlab.safeio import dumps
from ortlab.spec import RunSpec
from ortlab.wire import FINAL_TAG, METRIC_TAG, PAUSED_TAG, TAGS

# A tagged line longer than this is not one ortlab printed (a record is a few KiB, the final status with its
# traceback tens); a partial line longer than this is cut, so a writer that never ends its line cannot fill memory.
MAX_LINE_CHARS = 4 * 1024 * 1024
# How long the cluster may stay silent (head restarted, network lost) before the run is declared failed.
LOST_GRACE_S = 20.0


# --- where a job's run folder is -------------------------------------------------------------------------------


def storage_for(spec: Any) -> RunStorage:
    """Where this spec's remote run places live: a folder both sides mount, or an object store (`objstore`)."""
    if spec.target.storage:
        return storage_at(spec.target.storage)
    if spec.target.cluster == "local":
        return storage_at(cluster.cluster_dir() / "storage")
    raise RunError(
        f"target.storage: a run on {spec.target.cluster} needs a folder that both this machine and the cluster's "
        "workers can read and write (a shared file system); set target.storage"
    )


def recorded_storage(run: RunDir, spec: Any) -> RunPlace:
    """The remote run place that `run`'s status records, if it is one this spec's launch could have made.

    status.json is a file of the run folder, and a folder may come from anyone: a planted `launcher.storage` naming
    another folder would make a resume claim that folder (write its status, remove its control files) and the
    monitor bring its files home. Only `<storage>/<run id>` or `<storage>/<run id>-<6 hex>` (what `start` creates)
    directly inside the spec's storage is accepted (`place.place_in`).
    """
    launcher = run.read_status().get("launcher")
    recorded = launcher.get("storage") if isinstance(launcher, dict) else None
    storage = storage_for(spec)
    place = place_in(storage, run, recorded)
    if place is None:
        raise RunError(
            f"run {run.id}: its status names the remote folder {recorded!r}, which is not {storage.expected(run.id)} "
            "(where its launch puts it) or not the one this run folder's launch made (their shared secret differs or "
            "is missing); the run folder was edited, copied or damaged, so ortlab will not use that folder"
        )
    return place


# --- the local monitor -----------------------------------------------------------------------------------------


class RayJobMirror:
    """Mirrors one Ray job's run into its local run folder: its stream, state and results (the monitor's work).

    `cluster` is the address its launcher was given by the user (passed on the command line), never the one the
    folder's spec.yaml says: the monitor sends the user's Ray token there on every poll.

    The job's log is not ortlab's alone: the training libraries, the user's code and anything the job prints write
    to it, so a line that starts with one of ortlab's tags may still not be ortlab's record (cut, garbled, printed
    by someone else). Such a line is written to the run's log and counted (`skipped_lines` in status.json), never
    raised: one bad line must not cost a finished run its model.
    """

    def __init__(self, path: str | os.PathLike, cluster: str):
        self.run = RunDir(path)
        status = self.run.read_status()
        self.launcher = status["launcher"]
        self.cluster = cluster
        self.spec = RunSpec.from_run(self.run)
        self.remote = recorded_storage(self.run, self.spec)
        self.pending_since: float | None = None
        self.job_id = self.launcher["job_id"]
        # Records already here are skipped (a monitor restarted, a resumed run's job re-sends the history).
        self.have = len(read_metrics(self.run.metrics_path)[0])
        self.final: dict[str, Any] | None = None
        self.buffer = ""
        # Bad tagged lines in the current read of the job's log, and the most any read saw. Every read (a tail,
        # a tail restarted after a lost connection, the catch-up at the end) starts at the log's beginning, so the
        # most one read counted is the log's number, however often it was read.
        self.skipped, self.skipped_most, self.skipped_recorded = 0, 0, 0
        self.problems: list[str] = []  # what went wrong in `finish`'s steps (each isolated, see `_step`)
        self.forwarded: tuple[bool, str | None] | None = None  # the stop/pause requests last passed on
        self.log = os.fdopen(self.run.open_log(), "a", encoding="utf-8")
        # Every read starts at the log's beginning, so the run's log gets a line only past the most lines any
        # read got to (re-reading after each reconnect once wrote one line 32 times).
        self.line_no, self.logged = 0, 0
        # A Ray Train run (several processes) has its stream read from the run place as well: its rank 0 pushes
        # it there every LIVE_S, and that way home is shorter than the job's log (`livestream`).
        self.live = LiveStream(self.remote) if self.spec.target.processes > 1 else None

    def begin_read(self) -> None:
        """A new read of the job's log from its beginning."""
        self.buffer, self.skipped, self.line_no = "", 0, 0

    def feed(self, text: str) -> None:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        if len(self.buffer) > MAX_LINE_CHARS:  # a writer that never ends its line: keep the memory bounded
            self.log.write(f"{self.buffer[:200]}... ({len(self.buffer)} characters without a newline, cut)\n")
            self.buffer = ""
        fresh = []
        for line in lines:
            self.line_no += 1
            new = self.line_no > self.logged  # (not written to the run's log by an earlier read)
            self.logged = max(self.logged, self.line_no)
            # Another writer's partial line (a progress bar's "\r" without a newline) may precede a tag on the same
            # line of the job's log: the tag counts wherever it starts, what is before it goes to the run log.
            at = min((i for i in (line.find(t) for t in TAGS) if i >= 0), default=-1)
            if at > 0:
                if new:
                    self.log.write(line[:at] + "\n")
                line = line[at:]
            tag = next((t for t in TAGS if line.startswith(t)), None)
            if tag is None:
                if new:
                    self.log.write(line + "\n")
                continue
            value = _tagged(tag, line)
            if value is None:
                self._skip(line, new)
            elif tag == METRIC_TAG:
                fresh.append((value["seq"], value["record"]))
            elif tag == PAUSED_TAG:
                self.run.update_status(paused=value)
            else:
                self.final = value
        self._append(fresh)
        if self.skipped_most != self.skipped_recorded:
            self.run.update_status(**self.skipped_fields())
            self.skipped_recorded = self.skipped_most
        self.log.flush()

    def _append(self, numbered: list[tuple[int, dict[str, Any]]]) -> None:
        """The records whose sequence number is the next one this folder needs, in order: each once, whichever way
        it came first (the job's log, the run place), and none out of order (a gap is filled by the other way, or
        by the catch-up at the end)."""
        fresh = []
        for seq, record in numbered:
            if seq == self.have:
                fresh.append(record)
                self.have += 1
        if not fresh:
            return
        with self.run.metrics_path.open("a", encoding="utf-8") as f:
            f.write("".join(dumps(r) + "\n" for r in fresh))
        steps = [r["step"] for r in fresh if r.get("event") == events.STEP and _is_int(r.get("step"))]
        if self.run.read_status().get("state") == "pending":
            with contextlib.suppress(RunStateError):
                self.run.set_status("running", started=time.time(), **self.skipped_fields())
        if steps:
            self.run.update_status(step=max(steps))

    def say(self, line: str) -> None:
        self.log.write(line + "\n")
        self.log.flush()

    def _skip(self, line: str, new: bool) -> None:
        self.skipped += 1
        self.skipped_most = max(self.skipped_most, self.skipped)
        if not new:
            return
        cut = line if len(line) <= 300 else f"{line[:300]}... ({len(line)} characters)"
        self.log.write(f"[ortlab monitor] skipped a tagged line that is not an ortlab record: {cut}\n")

    def skipped_fields(self) -> dict[str, Any]:
        """The status fields that say lines were skipped (none while none were)."""
        if not self.skipped_most:
            return {}
        return {
            "skipped_lines": self.skipped_most,
            "warning": f"{self.skipped_most} line(s) of the job's log carried an ortlab tag but were not ortlab "
            f"records (cut, garbled or printed by other code) and were skipped; they are in {self.run.log_path}",
        }

    def forward_controls(self) -> None:
        """The local stop/pause requests (what Run.stop and Run.pause write) go to the storage folder, when they
        change (an object store is not asked twice a second what it already holds)."""
        wanted = (self.run.stop_requested(), self.run.read_pause())
        if wanted == self.forwarded:
            return
        with contextlib.suppress(OSError):
            stop, pause = wanted
            if stop:
                self.remote.request_stop()
            if pause is not None:
                self.remote.request_pause(pause_step(pause))
            else:
                self.remote.clear_pause()
            self.forwarded = wanted

    async def _tail(self, client: Any) -> None:
        self.begin_read()
        async for chunk in client.tail_job_logs(self.job_id):
            self.feed(chunk)
            self.forward_controls()

    def connect(self) -> Any:
        # The address came from the user through the launcher (see the class docstring), so the token may go there.
        return cluster.connect(self.cluster, trusted=True)

    def while_pending(self, client: Any) -> tuple[str, str] | None:
        """A job the cluster has not started yet: a stop asked for now stops it (nothing inside it could see the
        request yet); one still waiting after target.start_timeout_s is stopped too, with the reason (which
        resources it asks for). Returns the job's end as (Ray's state, why) once it is stopped, else None.

        Ray 2.60 keeps a job stopped while it waited listed as PENDING (its supervisor, which never ran, is killed;
        the job fails by Ray's own start timeout much later): the monitor ends the run itself, not waiting for that."""
        self.pending_since = self.pending_since or time.monotonic()
        t = self.spec.target
        if self.run.stop_requested():
            end = ("STOPPED", "stopped before the cluster started the job")
        elif time.monotonic() - self.pending_since > t.start_timeout_s:
            gpus = f" and {t.gpus_per_process:g} GPU(s)" if t.gpus_per_process else ""
            end = (
                "FAILED",
                f"the cluster {self.cluster} could not start the job within target.start_timeout_s "
                f"({t.start_timeout_s:g} s): it asks for {t.cpus_per_process:g} CPU(s){gpus}, which no node had free "
                "(other jobs hold them, or a node was lost); the job was stopped",
            )
        else:
            return None
        failed = cluster.stop_job(self.cluster, self.job_id, client)
        if failed:  # it keeps waiting on the cluster: say so, with the command that stops it
            end = ("FAILED", f"{end[1]}; but stopping it failed {failed}")
        return end

    def follow(self) -> None:
        import asyncio

        silent_since: float | None = None
        client, reason = None, ""
        while True:
            self.forward_controls()
            try:
                client = client or self.connect()
                state = str(client.get_job_status(self.job_id).value)
                silent_since = None
            except Exception as e:  # the head is gone, or restarting: give it LOST_GRACE_S
                client, reason = None, str(e).splitlines()[0] if str(e) else type(e).__name__
                if "does not exist" in reason or "not found" in reason.lower():
                    return self.finish("FAILED", client, f"the job {self.job_id} vanished from the cluster ({reason})")
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > LOST_GRACE_S:
                    return self.finish(
                        "FAILED",
                        None,
                        f"the cluster {self.cluster} stopped answering for {LOST_GRACE_S:.0f} s (head "
                        f"restarted or node lost): {reason}",
                    )
                time.sleep(1.0)
                continue
            if state == "PENDING":
                ended = self.while_pending(client)
                if ended is not None:
                    return self.finish(ended[0], None, ended[1])
                time.sleep(0.3)
                continue
            if state in ("SUCCEEDED", "FAILED", "STOPPED") and self.pending_since is not None:
                # Ended before it ever ran (stopped while it waited): its log has nothing to tail, and a tail of it
                # never returns; the catch-up reads what there is.
                return self.finish(state, client, reason)
            if state == "RUNNING" and self.run.read_status().get("state") == "pending":
                with contextlib.suppress(RunStateError):
                    self.run.set_status("running", started=time.time(), **self.skipped_fields())
            try:
                # Pass the stop/pause requests on while the log stream is quiet, too.
                asyncio.run(self._tail_with_controls(client))
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"
            try:
                state = str(client.get_job_status(self.job_id).value)
            except Exception:
                client = None
                continue
            if state in ("SUCCEEDED", "FAILED", "STOPPED"):
                # The stream closed at the end: every tagged line has arrived.
                return self.finish(state, client, reason)
            time.sleep(0.3)  # the stream closed while the job runs: read it again, without spinning

    async def _tail_with_controls(self, client: Any) -> None:
        import asyncio

        async def controls() -> None:
            while True:
                await asyncio.sleep(0.5)
                self.forward_controls()

        sides = [asyncio.ensure_future(controls())]
        if self.live is not None:
            sides.append(asyncio.ensure_future(self.live.follow(self._append, self.say)))
        try:
            await self._tail(client)
        finally:
            for side in sides:
                side.cancel()

    def catch_up(self, client: Any) -> None:
        """The log stream may close before its last lines came through: the tail of the job's log, read once it
        has ended, completes the records (by sequence number, so nothing twice) and the final status. Only the tail
        (`job_log_tail`): a job's log holds what every library printed, and was read whole into memory here."""
        logs, how = job_log_tail(client, self.job_id)
        self.log.write(f"[ortlab monitor] caught up from {how}\n")
        tagged = [ln[ln.find("@@ortlab-") :] for ln in logs.splitlines() if "@@ortlab-" in ln]
        if tagged:
            self.begin_read()
            self.feed("\n".join(ln for ln in tagged if ln.startswith((METRIC_TAG, FINAL_TAG))) + "\n")
        # Last resort, the source of truth: records the log lost for good are in the storage's metrics, read by the
        # run folder's bounded reader and appended a piece at a time (memory stays flat whatever the stream's size).
        with contextlib.suppress(OSError), self.run.metrics_path.open("a", encoding="utf-8") as f:
            piece: list[str] = []
            for index, record in enumerate(self.remote.records()):
                if index >= self.have:
                    piece.append(dumps(record) + "\n")
                    if len(piece) >= 1000:
                        f.write("".join(piece))
                        self.have, piece = self.have + len(piece), []
            f.write("".join(piece))
            self.have += len(piece)

    def _step(self, what: str, fn: Any, *args: Any) -> None:
        """One step of `finish`, isolated: whatever it raises is logged, and the next steps still run."""
        try:
            fn(*args)
        except Exception as e:
            self.problems.append(f"{what}: {type(e).__name__}: {e}")
            with contextlib.suppress(Exception):
                import traceback

                self.log.write(f"[ortlab monitor] {what} failed:\n{traceback.format_exc()}")
                self.log.flush()

    def finish(self, job_state: str, client: Any, reason: str) -> None:
        """Complete the records, bring the results home, then set the final state: each step on its own, so a
        problem in one (a bad line, a lost connection) never keeps a finished job's model from coming home."""
        if self.buffer:
            self._step("reading the last line", self.feed, "\n")
        if self.live is not None:
            self._step("taking what was read from the run place", lambda: self._append(self.live.take()))
        if client is not None:
            self._step("catching up with the job's log", self.catch_up, client)
        self._step("bringing the results home", self.bring_home)
        self._step("recording the end", self._record_end, job_state, client, reason)

    def _record_end(self, job_state: str, client: Any, reason: str) -> None:
        final = self.final or {}
        state = final.get("state")
        fields = {k: final[k] for k in ("error", "traceback", "checkpoint") if isinstance(final.get(k), str)}
        fields["step"] = final["step"] if _is_int(final.get("step")) else self.run.last_step()
        fields.update(self.skipped_fields())
        if self.problems:
            fields["monitor_problems"] = self.problems
        if state not in TERMINAL:
            state = "stopped" if job_state == "STOPPED" else "failed"
            message = reason
            if client is not None:
                with contextlib.suppress(Exception):
                    message = (client.get_job_info(self.job_id).message or reason).split(", last available logs")[0]
            if "exit code 137" in message or "exit code -9" in message:
                message += " (SIGKILL: the worker was killed, e.g. out of memory or by hand)"
            if state == "failed":
                fields["error"] = f"the remote job ended without a result: {message}"
                with contextlib.suppress(Exception):
                    tail, _ = job_log_tail(client, self.job_id, lines=200, limit=64 * 1024)
                    lines = [ln for ln in tail.splitlines() if not ln.startswith("@@")]
                    fields["traceback"] = "\n".join(lines[-30:])
        with contextlib.suppress(RunStateError):
            self.run.set_status(state, job_state=job_state, **fields)

    def give_up(self, why: str) -> None:
        """The monitor itself failed (a bug, a full disk): bring home what is there, stop the job (nothing would
        follow it any more) and say so in the status, rather than leave a `running` run whose monitor is gone."""
        self._step("bringing the results home", self.bring_home)
        failed = cluster.stop_job(self.cluster, self.job_id)  # (the user's address: see the class docstring)
        job = f"the Ray job {self.job_id} " + (f"could not be stopped {failed}" if failed else "was stopped")
        error = f"the monitor of the run failed ({why}); {job}; see {self.run.log_path}, and resume the run to go on"
        with contextlib.suppress(RunStateError):
            self.run.set_status("failed", error=error, step=self.run.last_step(), **self.skipped_fields())

    def bring_home(self) -> None:
        """model/, result.json, tune.json and the last checkpoint: export, push and resume read them here. Through
        `place.bring_home`: staged, swapped in when whole, nothing local removed for a remote that has less."""
        for item in bring_home(self.remote, self.run):
            self.log.write(f"not brought home from {self.remote.path}: {item}\n")
        self.log.flush()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tagged(tag: str, line: str) -> Any:
    """The payload of a tagged line if it is what ortlab's job prints with `tag`, else None.

    Metric: {"seq": n >= 0, "record": {...}}; paused: true or false; final: the status object.
    """
    if len(line) > MAX_LINE_CHARS:
        return None
    try:
        value = json.loads(line[len(tag) :])
    except ValueError:  # (JSONDecodeError, and a number too long to convert)
        return None
    if tag == METRIC_TAG:
        ok = isinstance(value, dict) and _is_int(value.get("seq")) and value["seq"] >= 0
        return value if ok and isinstance(value.get("record"), dict) else None
    if tag == PAUSED_TAG:
        return value if isinstance(value, bool) else None
    return value if isinstance(value, dict) else None


def monitor_main(path: str, cluster: str) -> int:
    monitor = RayJobMirror(path, cluster)
    try:
        monitor.follow()
    except Exception as e:
        import traceback

        traceback.print_exc()
        monitor.give_up(f"{type(e).__name__}: {e}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ortlab.runner.rayentry")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("monitor")
    m.add_argument("run_dir")
    m.add_argument("--cluster", required=True, help="the address the launcher was given (not the folder's)")
    a = p.parse_args(argv)
    return monitor_main(a.run_dir, a.cluster)
