"""Job side: the job's end of a Ray job's channel home: train, and print every record for the monitor to read.

The job's entrypoint on the cluster (`python -m ortlab.job worker RUN_PLACE`) trains exactly as a local worker
does (`ortlab.lifecycle.execute`) and, beside it, prints every record its metrics.jsonl receives as one tagged line
with its sequence number, and at the end the final status. The job's log stream is the one channel every Ray
cluster offers the client (Ray Jobs has no file download), so metrics arrive live even where the storage is slow to
sync. The other end, on the user's machine, is `ortlab.runner.monitor`. Where the run place is an object store, the
job trains in a node-local copy kept in step with it (`ortlab.job.mirror`).

The tags are defined once, for both ends, beneath both (`ortlab.wire`): a tagged line is one of ortlab's records
only if it parses as the shape its tag promises (the monitor checks; the job's log is shared with every library and
the user's code).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from typing import Any

from ortlab.job.mirror import Mirror, node_folder
from ortlab.lifecycle.execute import execute
from ortlab.runfolder.objstore import StoreError
from ortlab.runfolder.place import folder_here, place_at, probe_storage
from ortlab.runfolder.rundir import RunDir, read_metrics
from ortlab.wire import DOCTOR_TAG, FINAL_TAG, METRIC_TAG, PAUSED_TAG


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


def job_worker_main(path: str, resume: bool) -> int:

    place = place_at(path)
    run = folder_here(place)
    if run is not None:  # a folder both sides mount: train in it
        return streamed(run, lambda: execute(run, resume=resume, progress=False))
    # No folder to open here (an object store): train in a node-local copy, kept in step with the place
    # (`mirror.Mirror`). The results are pushed before the final status is printed, so a monitor that sees the end
    # finds them there.
    mirror = Mirror(place, node_folder(place))
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

    # The launch's check on the cluster: cached answers, only a group never probed on this node probed (issue #42).
    report = doctor(retry=False, peak=False).to_dict()
    if storage:  # the cluster's side of the storage check: can a job here write and read it?
        try:
            probe_storage(storage)  # (a URI: what `place.cluster_probe` gives the doctor job)
            report["storage"] = "ok"
        except StoreError as e:
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
