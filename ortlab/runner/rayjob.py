"""Driver side: the Ray Jobs launcher: a run as a Ray job on a cluster (`target.cluster`), mirrored home.

    preflight  the cluster's own doctor, run there as a short job (reachable, token accepted, ortlab installed,
               enough CPUs and GPUs, every acceleration asked for available there): not this machine's; an
               object store is probed from both sides (an object written, read back, removed)
    start      a copy of the run folder in the storage (`<storage>/<run id>`: a shared folder, or an object store,
               see `objstore`), a job whose entrypoint trains there, and a local monitor that brings the job's
               stream and results home (`ortlab.runner.monitor`)
    terminate  the job stopped on the cluster, through its client (a hung job, or one never started)
    bring_home model/, result.json, tune.json and the last checkpoint, copied from the storage (the monitor does
               this when the job ends; calling it again copies what is there now)

The Ray token goes only to an address the user named (see `ortlab.runner.trust`): the spec given to `launch`, or
the address a resume names or vouches for.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from typing import Any

from ortlab import cluster, safeio
from ortlab.envvars import SAFE_PATH, WITHOUT_HUB_TOKEN, cache_dir, child_cwd, child_env, ortlab_path
from ortlab.netutil import LOOPBACK_INTERFACE
from ortlab.runfolder import vouch
from ortlab.runfolder.objstore import StoreError
from ortlab.runfolder.place import bind, bring_home, cluster_probe, probe_storage
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir, RunStateError, pause_step
from ortlab.runner.joblog import job_log_tail
from ortlab.runner.launcher import Launcher, RunError, mix_problems
from ortlab.runner.monitor import recorded_storage, storage_for
from ortlab.runner.trust import storage_gate
from ortlab.spec import RunSpec
from ortlab.wire import DOCTOR_TAG

DOCTOR_TIMEOUT_S = 180.0
# A cluster's doctor answer is kept on disk (`cache_dir()/cluster-doctor/`) and reused for this long (a doctor job
# costs seconds to minutes; each `ortlab train --cluster` is a new process, and a notebook launches several runs in a
# row): within one session of the cluster (its head's session name: a restarted head is asked again) for
# DOCTOR_SESSION_TTL_S, where the session cannot be told for DOCTOR_TTL_S.
DOCTOR_TTL_S = 300.0
DOCTOR_SESSION_TTL_S = 3600.0
DOCTOR_LOG_BYTES = 4 << 20  # the doctor job's log is read from its tail, at most this much (its report is a line)
JOB = "ortlab.job"  # what a job runs on the cluster (`python -m ortlab.job worker|doctor|raytrain ...`)
MONITOR = "ortlab.runner.rayentry"  # the local monitor's process (`ortlab.runner.monitor`)


def _client(spec: Any) -> Any:
    try:
        # The launcher passes only an address the user named (the spec given to `launch`, or one `Run.resume`
        # checked: see `ortlab.runner.trust.trusted_target`), so the user's token may go there.
        return cluster.connect(spec.target.cluster, trusted=True)
    except cluster.ClusterError as e:
        raise RunError(str(e)) from None


def _python_for(spec: Any) -> tuple[str, dict[str, Any]]:
    """(python command, runtime_env) for the job. On the local head: this interpreter and this ortlab source.
    Elsewhere: `python` on the cluster, which must have ortlab installed (the doctor job checks it)."""
    # How long Ray Train waits for a worker group's resources: the spec's bound (see ortlab.job.raytrain.drive).
    start = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": f"{spec.target.start_timeout_s:g}"}
    if spec.target.cluster == "local":
        env = {"PYTHONPATH": ortlab_path(), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **start}
        env.update(SAFE_PATH)
        # The local head is on loopback only: so are the process groups of its Ray Train workers (their store:
        # `ortlab.job.raygroup`; gloo would otherwise bind to the address the host name resolves to).
        env["GLOO_SOCKET_IFNAME"] = LOOPBACK_INTERFACE
        return shlex.quote(sys.executable), {"env_vars": env}
    # PYTHONSAFEPATH: `python -m ortlab.job` imports nothing from the folder Ray starts it in (Python >= 3.11).
    return "python", {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **SAFE_PATH, **start}}


def _resources(spec: Any) -> dict[str, Any]:
    t = spec.target
    out: dict[str, Any] = {"entrypoint_num_cpus": t.cpus_per_process}
    if t.gpus_per_process:
        out["entrypoint_num_gpus"] = t.gpus_per_process
    return out


def resource_problems(spec: Any, report: dict[str, Any]) -> list[str]:
    """The target's CPUs and GPUs against the cluster's (its doctor's `resources`: totals, and `nodes`: what each
    node offers, since a process runs on one node)."""
    t = spec.target
    total = report.get("resources") or {}
    nodes = [n for n in report.get("nodes") or [] if isinstance(n, dict)] or [total]
    has = f"it has {total.get('CPU', 0):g} CPU(s) and {total.get('GPU', 0):g} GPU(s) on {len(nodes)} node(s)"
    problems = []
    gpus, cpus = (t.gpus_per_process or 0) * t.processes, t.cpus_per_process * t.processes
    if gpus > total.get("GPU", 0):
        problems.append(
            f"target: the run asks for {gpus:g} GPU(s) in all, but the cluster at {t.cluster} has "
            f"{total.get('GPU', 0):g}; {has}"
        )
    if cpus > total.get("CPU", 0):
        problems.append(
            f"target: the run asks for {cpus:g} CPU(s) in all ({t.processes} process(es) x "
            f"{t.cpus_per_process:g}), but the cluster at {t.cluster} has {total.get('CPU', 0):g}; {has}"
        )
    fits = [n for n in nodes if n.get("CPU", 0) >= t.cpus_per_process and n.get("GPU", 0) >= (t.gpus_per_process or 0)]
    if not fits and not problems:
        problems.append(
            f"target: no node of the cluster at {t.cluster} offers {t.cpus_per_process:g} CPU(s) and "
            f"{t.gpus_per_process or 0:g} GPU(s) for one process; {has}"
        )
    return problems


def cluster_doctor(spec: Any) -> dict[str, Any]:
    """Run ortlab's doctor on the cluster (a short job with no special resources) and return its report, with the
    cluster's total resources under `resources`, and for an object store `storage`: "ok", or why a job there
    cannot write and read it.

    Cached on disk per cluster session (see DOCTOR_SESSION_TTL_S). A doctor that does not finish within
    DOCTOR_TIMEOUT_S (a busy machine: the job's Python imports torch among other jobs) does not fail the launch by
    itself: the last answer this cluster gave is used, marked `stale`; with none, the report says `unchecked` and
    the launch goes on (`RayJob.preflight` says so): the job itself then fails with the reason if the cluster cannot
    run it."""
    client = _client(spec)  # (also when the answer is cached: the cluster must answer, and accept the token)
    python, runtime_env = _python_for(spec)
    probe = cluster_probe(spec.target.storage)
    from ortlab import __version__

    key = [client.get_address(), python, probe, __version__]
    session = _session(client)
    cached = _cached_doctor(key)
    if cached is not None:
        age = time.time() - cached["time"]
        same_session = session is not None and cached.get("session") == session
        if age < (DOCTOR_SESSION_TTL_S if same_session else DOCTOR_TTL_S):
            return cached["report"]
    job = client.submit_job(
        entrypoint=f"{python} -m {JOB} doctor" + (f" --storage {shlex.quote(probe)}" if probe else ""),
        submission_id=f"ortlab-doctor-{secrets.token_hex(4)}",
        runtime_env=runtime_env,
        entrypoint_num_cpus=0,
    )
    deadline = time.monotonic() + DOCTOR_TIMEOUT_S
    while True:
        state = str(client.get_job_status(job).value)
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        if time.monotonic() > deadline:
            with contextlib.suppress(Exception):
                client.stop_job(job)
            slow = f"ortlab's doctor did not finish on {spec.target.cluster} within {DOCTOR_TIMEOUT_S:.0f} s"
            if cached is not None:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(cached["time"]))
                return {**cached["report"], "stale": f"{slow}; its answer of {when} is used"}
            return {"unchecked": f"{slow} (a busy cluster?) and gave no answer before", "accelerations": {}}
        time.sleep(0.3)
    logs, _ = job_log_tail(client, job, lines=1000, limit=DOCTOR_LOG_BYTES)
    for line in logs.splitlines():
        if line.startswith(DOCTOR_TAG):
            report = json.loads(line[len(DOCTOR_TAG) :])
            _keep_doctor(key, session, report)
            return report
    last = "\n".join(logs.strip().splitlines()[-5:])
    raise RunError(
        f"ortlab's doctor could not run on {spec.target.cluster} (is ortlab installed on its workers? "
        f"pip install ortlab[remote] there):\n{last}"
    )


def _session(client: Any) -> str | None:
    """The cluster's session name (a new one each time its head starts), from its dashboard; None if not told."""
    with contextlib.suppress(Exception):
        name = client._do_request("GET", "/api/version", timeout=10).json().get("session_name")
        return name if isinstance(name, str) else None
    return None


def _doctor_file(key: list[Any]) -> tuple[Any, str]:
    import hashlib

    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20] + ".json"
    return cache_dir() / "cluster-doctor", name


def _cached_doctor(key: list[Any]) -> dict[str, Any] | None:
    """The last answer kept for this cluster, interpreter and store, or None (none, damaged, another key)."""
    folder, name = _doctor_file(key)
    try:
        data = json.loads(safeio.read_bytes(folder, name, limit=DOCTOR_LOG_BYTES))
        if data.get("key") != key or not isinstance(data.get("time"), float) or not isinstance(data["report"], dict):
            return None
        data["report"]["accelerations"].items()  # (a report the checks can read)
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _keep_doctor(key: list[Any], session: str | None, report: dict[str, Any]) -> None:
    """Best effort: a read-only cache means the doctor runs again next time, nothing worse."""
    folder, name = _doctor_file(key)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        safeio.write_json(folder, name, {"key": key, "session": session, "time": time.time(), "report": report}, False)


class RayJob(Launcher):
    kind = "ray-job"

    def doctor(self, spec: Any) -> dict[str, Any]:
        return cluster_doctor(spec)

    def preflight(self, spec: Any) -> dict[str, Any]:
        """Check the spec against the cluster, before anything is created: reachable, authenticated, enough GPUs,
        and every acceleration asked for available there (the cluster's doctor, not this machine's)."""
        storage = storage_for(spec)
        try:  # this machine's side of the storage (the doctor job checks the cluster's side of an object store)
            probe_storage(storage)
        except StoreError as e:
            raise RunError(
                f"target.storage: this machine {e} (the monitor brings the results home through it; check "
                "this machine's access to it: for an object store its credentials, e.g. AWS_ACCESS_KEY_ID, and "
                "the bucket)"
            ) from None
        report = cluster_doctor(spec)
        if report.get("unchecked") or report.get("stale"):
            import warnings

            warnings.warn(
                f"{report.get('unchecked') or report.get('stale')}: the run is launched without the cluster's "
                "check of this moment (if the cluster cannot run it, the job fails saying why)",
                RuntimeWarning,
                stacklevel=2,
            )
        problems = self.shape_problems(spec)
        if not report.get("unchecked"):  # (what only the cluster's answer can judge)
            problems += resource_problems(spec, report)
            if cluster_probe(spec.target.storage) and report.get("storage") != "ok":
                problems.append(
                    f"target.storage: a job on the cluster {report.get('storage') or 'could not check the storage'} "
                    "(the workers write checkpoints and the model there; check the cluster's credentials for the "
                    "store)"
                )
            problems += mix_problems(spec, report["accelerations"], f"the cluster {spec.target.cluster}")
        if spec.accel.tcmalloc is True:
            problems.append(
                "accel.tcmalloc: not on a Ray cluster yet (an allocator is chosen when a process starts, and Ray's "
                "own processes start the ones that train there); set it to 'auto', which trains there with glibc's "
                "malloc"
            )
        if problems:
            raise RunError("this run cannot start on the cluster:\n" + "\n".join(f"  - {p}" for p in problems))
        return report

    def shape_problems(self, spec: Any) -> list[str]:
        """What this launcher cannot do with the spec's processes (one job: one process)."""
        if spec.target.processes > 1:  # (launcher_for gives such a spec to RayTrain: a direct caller's mistake)
            return ["target.processes: a Ray job trains in one process; several are a Ray Train run (RayTrain)"]
        if spec.accel.zero_stage:
            return [
                "accel.zero_stage: ZeRO shards the optimizer state across the training processes, and this run has "
                "one, so it would shard nothing; set target.processes to 2 or more, or zero_stage: 0"
            ]
        return []

    def entrypoint(self, spec: Any, remote: str) -> str:
        """The job's command after the interpreter (`remote`: the storage run folder, shell-quoted)."""
        return f"-m {JOB} worker {remote}"

    def job_resources(self, spec: Any) -> dict[str, Any]:
        """What the job's entrypoint reserves on the cluster: here, the one training process's CPUs and GPUs."""
        return _resources(spec)

    def start(
        self, run: RunDir, spec: Any, resume: bool = False, cwd: str | None = None, hub_token: bool = True
    ) -> subprocess.Popen:
        """Submit the job of a claimed (`pending`) local run folder and start its monitor."""
        storage = storage_for(spec)
        client = _client(spec)
        if resume:
            launcher = run.read_status()["launcher"]
            remote = recorded_storage(run, spec)
            try:
                previous = str(client.get_job_status(launcher["job_id"]).value)
            except Exception:  # the job is gone from the cluster (e.g. a restarted head): it runs no more
                previous = "GONE"
            if previous not in ("SUCCEEDED", "FAILED", "STOPPED", "GONE"):
                run.set_status("failed", error=f"the previous job {launcher['job_id']} is still {previous}")
                command = cluster.ray_command(spec.target.cluster, "job", "stop", launcher["job_id"])
                raise RunError(
                    f"run {run.id} could not resume: its previous job {launcher['job_id']} is still {previous} on the "
                    f"cluster; stop it first: {command}"
                )
            try:
                if remote.read_status().get("state") in ("pending", "running"):  # its worker was killed: say so
                    ended = f"the job {launcher['job_id']} ended ({previous}) without a result"
                    remote.set_status("failed", error=ended)
                # Its stop and pause requests cleared under its status lock, before it shows `pending` (claim).
                remote.claim(pid=None, create_time=None, resumed=True)
            except (RunStateError, OSError) as e:
                run.set_status("failed", error=f"the remote run folder cannot resume: {e}")
                raise RunError(f"run {run.id} could not resume on the cluster: {e}") from None
        else:
            remote = storage.new_place(run.id, safeio.read_bytes(run.path, "spec.yaml"))
            bind(remote, run)  # (only this folder can claim it or bring it home: `place.place_in`)
        pause = run.read_pause()
        if pause is not None:  # a gate set before the start holds the remote run from its first step
            remote.request_pause(pause_step(pause))
        python, runtime_env = _python_for(spec)
        if not hub_token:
            runtime_env["env_vars"].update(WITHOUT_HUB_TOKEN)
        entry = f"{python} {self.entrypoint(spec, shlex.quote(str(remote.path)))}"
        job_id = f"ortlab-{run.id}-{secrets.token_hex(4)}"
        try:
            client.submit_job(
                entrypoint=entry + (" --resume" if resume else ""),
                submission_id=job_id,
                runtime_env=runtime_env,
                **self.job_resources(spec),
            )
        except Exception as e:
            run.set_status("failed", error=f"the job could not be submitted to {spec.target.cluster}: {e}", step=0)
            raise RunError(f"run {run.id} could not be submitted: {e}") from None
        launcher = {"kind": self.kind, "cluster": spec.target.cluster, "job_id": job_id, "storage": str(remote.path)}
        run.update_status(launcher=launcher, runtime="cluster")

        with os.fdopen(run.open_log(), "ab") as log:  # no link followed (see RunDir.open_log)
            log.write(f"\n$ ray job {job_id} on {spec.target.cluster}: {entry}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", MONITOR, "monitor", str(run.path.resolve())),
                    *("--cluster", spec.target.cluster),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                cwd=child_cwd(),
                start_new_session=True,  # outlives the kernel: a restart loses nothing
            )
        run.update_status(pid=proc.pid, create_time=process_create_time(proc.pid))
        return proc

    def terminate(self, run: RunDir, status: dict[str, Any]) -> None:
        """The run did not stop when asked (its job is hung, or never started): stop its Ray job on the cluster,
        through the job ortlab submitted; its monitor then records the end. Only on a cluster the user named on this
        machine ('local', or one in $ORTLAB_RAY_ADDRESSES): the address comes from the run folder."""
        launcher = status.get("launcher") if isinstance(status.get("launcher"), dict) else {}
        job = launcher.get("job_id")
        address = launcher.get("cluster")
        if not isinstance(job, str) or not isinstance(address, str):
            raise RunError(f"run {run.id} did not stop when asked, and its status names no Ray job to stop")
        if not cluster.is_configured(address):
            raise RunError(
                f"run {run.id} did not stop when asked: its Ray job {job} is on {address}, an address you have not "
                f"named on this machine, so ortlab sends it no token; list it in ${cluster.ADDRESSES_ENV} to stop it"
            )
        failed = cluster.stop_job(address, job)  # (a named cluster: checked just above)
        if failed:
            raise RunError(f"run {run.id}: its Ray job {job} could not be stopped {failed}")

    def bring_home(self, run: RunDir) -> None:
        spec = RunSpec.from_run(run)
        # This machine's credentials sign the requests: only to a store the user listed, or named in the launch.
        storage_gate(run.id, spec, vouch.marked(run))
        remote = recorded_storage(run, spec)
        try:
            left = bring_home(remote, run)
        except StoreError as e:
            raise RunError(f"run {run.id}: {e}") from None
        if left:
            with os.fdopen(run.open_log(), "a", encoding="utf-8") as log:
                log.writelines(f"not brought home from {remote.path}: {item}\n" for item in left)
