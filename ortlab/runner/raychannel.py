"""Both ends of a Ray job's channel home: what the job prints, and the local monitor that reads it.

    local run folder (what Run, follow, export, the workbench read)       storage (both sides read and write it)
      spec.yaml, status.json  <- mirrored by the monitor                    <storage>/<run id>/  a whole run folder,
      metrics.jsonl           <- appended by the monitor, in order,         written by the worker as a local run's
                                 each record once (by sequence number)       (the source of truth)
      model/, result.json, checkpoints/  <- copied home when the job ends
      control/stop, control/pause  -> forwarded to the storage folder

The job's entrypoint on the cluster (`python -m ortlab.runner.rayentry worker STORAGE_RUN`) trains exactly as a
local worker does (`ortlab.lifecycle.execute`) and, beside it, prints every record its metrics.jsonl receives as
one tagged line with its sequence number, and at the end the final status. The local *monitor* (`python -m
ortlab.runner.rayentry monitor RUN --cluster ADDRESS`, detached, its PID recorded in status.json like a local
worker's) tails the job's log stream, appends the records it has not got yet, mirrors the job's state, forwards
stop and pause, and brings the results home. The job's log stream is the one channel every Ray cluster offers the
client (Ray Jobs has no file download), so metrics arrive live even where the storage is slow to sync. The
launcher that submits the job and starts the monitor is `ortlab.runner.rayjob`. Where the storage is an object
store, the job trains in a node-local copy and the monitor reads the store through its client (`objstore`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ortlab import cluster, safeio
from ortlab.runfolder.rundir import TERMINAL, RunDir, RunStateError, read_metrics
from ortlab.runner.launcher import RunError
from ortlab.runner.objstore import Store, StoredRun, is_uri, jsonl_records
from ortlab.runner.objsync import Mirror, node_folder
from ortlab.safeio import dumps
from ortlab.spec import RunSpec

METRIC_TAG = "@@ortlab-metric "
FINAL_TAG = "@@ortlab-final "
DOCTOR_TAG = "@@ortlab-doctor "
PAUSED_TAG = "@@ortlab-paused "
TAGS = (METRIC_TAG, FINAL_TAG, PAUSED_TAG)
# A tagged line longer than this is not one ortlab printed (a record is a few KiB, the final status with its
# traceback tens); a partial line longer than this is cut, so a writer that never ends its line cannot fill memory.
MAX_LINE_CHARS = 4 * 1024 * 1024
# How long the cluster may stay silent (head restarted, network lost) before the run is declared failed.
LOST_GRACE_S = 20.0


# --- where a job's run folder is -------------------------------------------------------------------------------


def storage_for(spec: Any) -> Path | Store:
    """Where this spec's remote run folders live: a folder both sides mount, or an object store (`objstore`)."""
    if spec.target.storage and is_uri(spec.target.storage):
        return Store(spec.target.storage)
    if spec.target.storage:
        return Path(spec.target.storage)
    if spec.target.cluster == "local":
        return cluster.cluster_dir() / "storage"
    raise RunError(
        f"target.storage: a run on {spec.target.cluster} needs a folder that both this machine and the cluster's "
        "workers can read and write (a shared file system); set target.storage"
    )


def recorded_storage(run: RunDir, spec: Any) -> RunDir | StoredRun:
    """The remote run folder that `run`'s status records, if it is one this spec's launch could have made.

    status.json is a file of the run folder, and a folder may come from anyone: a planted `launcher.storage` naming
    another folder would make a resume claim that folder (write its status, remove its control files) and the
    monitor bring its files home. Only `<storage>/<run id>` or `<storage>/<run id>-<6 hex>` (what `start` creates),
    a real folder directly inside the spec's storage, is accepted.
    """
    launcher = run.read_status().get("launcher")
    recorded = launcher.get("storage") if isinstance(launcher, dict) else None
    storage = storage_for(spec)
    if isinstance(storage, Store):  # the same rule, on the URI: <storage URI>/<run id>[-<6 hex>], as `start` made it
        name = urlsplit(recorded).path.rsplit("/", 1)[-1] if isinstance(recorded, str) else ""
        if re.fullmatch(re.escape(run.id) + r"(-[0-9a-f]{6})?", name) and storage.child(name).uri == recorded:
            return StoredRun(storage.child(name))
        raise RunError(
            f"run {run.id}: its status names the remote folder {recorded!r}, which is not {storage.child(run.id)} "
            "(where its launch puts it); the run folder was edited or damaged, so ortlab will not use that folder"
        )
    name_ok = isinstance(recorded, str) and re.fullmatch(re.escape(run.id) + r"(-[0-9a-f]{6})?", Path(recorded).name)
    path = Path(recorded) if name_ok else None
    if path is None or path.is_symlink() or path.parent.resolve() != storage.resolve():
        raise RunError(
            f"run {run.id}: its status names the remote folder {recorded!r}, which is not {storage}/{run.id} "
            "(where its launch puts it); the run folder was edited or damaged, so ortlab will not use that folder"
        )
    return RunDir(path)


# --- the job's side --------------------------------------------------------------------------------------------


def print_tagged(tag: str, data: Any) -> None:
    sys.stdout.write(tag + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


class Streamer(threading.Thread):
    """Prints every record of the remote metrics.jsonl as a tagged line, with its sequence number (its index
    among the file's records), from the first one: a monitor skips what it already has."""

    def __init__(self, run: RunDir):
        super().__init__(daemon=True)
        self.folder, self.offset, self.seq, self.done = run, 0, 0, threading.Event()
        self.paused: bool | None = None

    def flush(self) -> None:
        records, self.offset = read_metrics(self.folder.metrics_path, self.offset)
        for record in records:
            print_tagged(METRIC_TAG, {"seq": self.seq, "record": record})
            self.seq += 1
        paused = bool(self.folder.read_status().get("paused"))  # a pause gate is held: the status says so
        if paused != self.paused:
            self.paused = paused
            print_tagged(PAUSED_TAG, paused)

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.flush()


def streamed(run: RunDir, body: Any) -> int:
    """Run `body()` (which trains `run`) while its records are printed for the monitor, then the final status.
    Returns the job's exit code: 1 if `body` raised."""
    streamer = Streamer(run)
    streamer.start()
    code = 0
    try:
        body()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        streamer.done.set()
        streamer.join()
        streamer.flush()
        print_tagged(FINAL_TAG, run.read_status())
    return code


def worker_main(path: str, resume: bool) -> int:
    from ortlab.lifecycle.execute import execute

    if not is_uri(path):  # a folder both sides mount: train in it
        run = RunDir(path)
        return streamed(run, lambda: execute(run, resume=resume, progress=False))
    # An object store: train in a node-local copy, kept in step with the store (objsync.Mirror). The results are
    # pushed before the final status is printed, so a monitor that sees the end finds them in the store.
    stored = StoredRun(Store(path))
    mirror = Mirror(stored, node_folder(stored))
    mirror.pull(resume)

    def body() -> None:
        with mirror.syncing():
            execute(mirror.local, resume=resume, progress=False)

    code = streamed(mirror.local, body)
    if code == 0:  # everything is in the store; a node's disk is not a place to keep checkpoints of past jobs
        shutil.rmtree(mirror.local.path.parent, ignore_errors=True)
    else:
        print(f"[ortlab storage] the job's copy of the run is kept on this node: {mirror.local.path}", flush=True)
    return code


def doctor_main(storage: str | None = None) -> int:
    from ortlab.probe import doctor

    report = doctor().to_dict()
    if storage:  # the cluster's side of the storage check: can a job here write and read it?
        try:
            Store(storage).probe()
            report["storage"] = "ok"
        except RunError as e:
            report["storage"] = str(e)
    try:
        import ray

        ray.init(logging_level="ERROR", log_to_driver=False)
        report["resources"] = {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        report["nodes"] = [
            {k: float(v) for k, v in node.get("Resources", {}).items() if k in ("CPU", "GPU")}
            for node in ray.nodes()
            if node.get("Alive")
        ]
        ray.shutdown()
    except Exception as e:  # the resources are a check's input: say why they are missing
        report["resources_error"] = f"{type(e).__name__}: {e}"
    print_tagged(DOCTOR_TAG, report)
    return 0


# --- the local monitor -----------------------------------------------------------------------------------------


class Monitor:
    """Brings one remote run's stream, state and results into its local run folder.

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
        self.remote = recorded_storage(self.run, RunSpec.from_run(self.run))
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

    def begin_read(self) -> None:
        """A new read of the job's log from its beginning."""
        self.buffer, self.skipped = "", 0

    def feed(self, text: str) -> None:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        if len(self.buffer) > MAX_LINE_CHARS:  # a writer that never ends its line: keep the memory bounded
            self.log.write(f"{self.buffer[:200]}... ({len(self.buffer)} characters without a newline, cut)\n")
            self.buffer = ""
        fresh = []
        for line in lines:
            # Another writer's partial line (a progress bar's "\r" without a newline) may precede a tag on the same
            # line of the job's log: the tag counts wherever it starts, what is before it goes to the run log.
            at = min((i for i in (line.find(t) for t in TAGS) if i >= 0), default=-1)
            if at > 0:
                self.log.write(line[:at] + "\n")
                line = line[at:]
            tag = next((t for t in TAGS if line.startswith(t)), None)
            if tag is None:
                self.log.write(line + "\n")
                continue
            value = _tagged(tag, line)
            if value is None:
                self._skip(line)
            elif tag == METRIC_TAG:
                if value["seq"] == self.have:
                    fresh.append(value["record"])
                    self.have += 1
            elif tag == PAUSED_TAG:
                self.run.update_status(paused=value)
            else:
                self.final = value
        if fresh:
            with self.run.metrics_path.open("a", encoding="utf-8") as f:
                f.write("".join(dumps(r) + "\n" for r in fresh))
            steps = [r["step"] for r in fresh if r.get("event") == "step" and _is_int(r.get("step"))]
            if self.run.read_status().get("state") == "pending":
                with contextlib.suppress(RunStateError):
                    self.run.set_status("running", started=time.time(), **self.skipped_fields())
            if steps:
                self.run.update_status(step=max(steps))
        if self.skipped_most != self.skipped_recorded:
            self.run.update_status(**self.skipped_fields())
            self.skipped_recorded = self.skipped_most
        self.log.flush()

    def _skip(self, line: str) -> None:
        self.skipped += 1
        self.skipped_most = max(self.skipped_most, self.skipped)
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
                self.remote.request_pause(int(pause) if pause.isdigit() else None)
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
                time.sleep(0.3)
                continue
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

        side = asyncio.ensure_future(controls())
        try:
            await self._tail(client)
        finally:
            side.cancel()

    def catch_up(self, client: Any) -> None:
        """The log stream may close before its last lines came through: the job's whole log, read once it has
        ended, completes the records (by sequence number, so nothing twice) and the final status."""
        try:
            logs = client.get_job_logs(self.job_id)
        except Exception:
            logs = ""
        tagged = [ln[ln.find("@@ortlab-") :] for ln in logs.splitlines() if "@@ortlab-" in ln]
        if tagged:
            self.begin_read()
            self.feed("\n".join(ln for ln in tagged if ln.startswith((METRIC_TAG, FINAL_TAG))) + "\n")
        # Last resort, the source of truth: records the log lost for good are in the storage's metrics.jsonl.
        with contextlib.suppress(OSError):
            if isinstance(self.remote, StoredRun):
                missing = jsonl_records(self.remote.metrics_bytes())[self.have :]
            else:
                missing = self.remote.metrics()[self.have :]
            if missing:
                with self.run.metrics_path.open("a", encoding="utf-8") as f:
                    f.write("".join(dumps(r) + "\n" for r in missing))
                self.have += len(missing)

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
                    lines = [ln for ln in client.get_job_logs(self.job_id).splitlines() if not ln.startswith("@@")]
                    fields["traceback"] = "\n".join(lines[-30:])
        with contextlib.suppress(RunStateError):
            self.run.set_status(state, job_state=job_state, **fields)

    def give_up(self, why: str) -> None:
        """The monitor itself failed (a bug, a full disk): bring home what is there and say so in the status,
        rather than leave a `running` run whose monitor is gone. The job may still run on the cluster."""
        self._step("bringing the results home", self.bring_home)
        error = (
            f"the monitor of the Ray job {self.job_id} failed ({why}); the job may still be running on "
            f"{self.cluster}: see {self.run.log_path}, stop it with `ray job stop {self.job_id}` or resume the run"
        )
        with contextlib.suppress(RunStateError):
            self.run.set_status("failed", error=error, step=self.run.last_step(), **self.skipped_fields())

    def bring_home(self) -> None:
        """model/, result.json, tune.json and the last checkpoint: export, push and resume read them here."""
        if isinstance(self.remote, StoredRun):  # the object store's client, into safeio writes (see objstore)
            self.remote.bring_home(self.run)
            return
        # The storage is a folder others can write: only its regular files come home, never what a link in it
        # points to (safeio.copy_files); what was left behind is said in the run's log.
        src, skipped = self.remote, []
        with contextlib.suppress(OSError):
            for name in ("result.json", "tune.json"):
                with contextlib.suppress(FileNotFoundError):
                    safeio.write_bytes(self.run.path, name, safeio.read_bytes(src.path, name), durable=True)
            if src.model_dir.is_dir():
                shutil.rmtree(self.run.model_dir, ignore_errors=True)
                skipped += safeio.copy_files(src.path, "model", self.run.model_dir)
            last = src.last_checkpoint()
            if last is not None:
                shutil.rmtree(self.run.checkpoints, ignore_errors=True)
                skipped += safeio.copy_files(src.path, f"checkpoints/{last.name}", self.run.checkpoints / last.name)
        for item in skipped:
            self.log.write(f"not brought home from the storage: {item}\n")
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
    monitor = Monitor(path, cluster)
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
    w = sub.add_parser("worker")
    w.add_argument("run_dir")
    w.add_argument("--resume", action="store_true")
    m = sub.add_parser("monitor")
    m.add_argument("run_dir")
    m.add_argument("--cluster", required=True, help="the address the launcher was given (not the folder's)")
    d = sub.add_parser("doctor")
    d.add_argument("--storage", help="an object store URI to write and read a probe object in")
    a = p.parse_args(argv)
    if a.command == "worker":
        return worker_main(a.run_dir, a.resume)
    if a.command == "monitor":
        return monitor_main(a.run_dir, a.cluster)
    return doctor_main(a.storage)
