"""The Ray Jobs launcher: a run as a Ray job on a cluster (`target.cluster`), mirrored into its local run folder.

    check      the cluster's own doctor, run there as a short job (reachable, token accepted, ortlab installed,
               enough CPUs and GPUs, every acceleration asked for available there): not this machine's; an
               object store is probed from both sides (an object written, read back, removed)
    start      a copy of the run folder in the storage (`<storage>/<run id>`: a shared folder, or an object store,
               see `objstore`), a job whose entrypoint trains there, and a local monitor that brings the job's
               stream and results home (`ortlab.runner.raychannel`)
    terminate  not done from here: it names `ray job stop`, which ends the job on the cluster
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
import shutil
import subprocess
import sys
import time
from typing import Any

from ortlab import cluster, safeio
from ortlab.envvars import child_env, ortlab_path
from ortlab.netutil import LOOPBACK_INTERFACE
from ortlab.runfolder.rundir import RunDir, RunStateError, process_create_time
from ortlab.runner.launcher import Launcher, RunError, mix_problems
from ortlab.runner.objstore import Store, StoredRun, is_uri
from ortlab.runner.raychannel import DOCTOR_TAG, Monitor, recorded_storage, storage_for

DOCTOR_TIMEOUT_S = 180.0
# A cluster's doctor answer is reused for this long in one process (a doctor job costs seconds; a notebook that
# launches several runs in a row asks the same cluster the same question).
DOCTOR_TTL_S = 300.0
_doctors: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
CHANNEL = "ortlab.runner.rayentry"  # both ends of the channel (`ortlab.runner.raychannel`) start from here


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
    if spec.target.cluster == "local":
        env = {"PYTHONPATH": ortlab_path(), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        # The local head is on loopback only: so are the process groups of its Ray Train workers (their store:
        # `ortlab.runner.raygroup`; gloo would otherwise bind to the address the host name resolves to).
        env["GLOO_SOCKET_IFNAME"] = LOOPBACK_INTERFACE
        return shlex.quote(sys.executable), {"env_vars": env}
    return "python", {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}}


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
    cannot write and read it."""
    client = _client(spec)  # (also when the answer is cached: the cluster must answer, and accept the token)
    python, runtime_env = _python_for(spec)
    probe = spec.target.storage if is_uri(spec.target.storage) else None
    key = (client.get_address(), python, probe)
    cached = _doctors.get(key)
    if cached is not None and time.monotonic() - cached[0] < DOCTOR_TTL_S:
        return cached[1]
    job = client.submit_job(
        entrypoint=f"{python} -m {CHANNEL} doctor" + (f" --storage {shlex.quote(probe)}" if probe else ""),
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
            raise RunError(f"ortlab's doctor did not finish on {spec.target.cluster} within {DOCTOR_TIMEOUT_S:.0f} s")
        time.sleep(0.3)
    logs = client.get_job_logs(job)
    for line in logs.splitlines():
        if line.startswith(DOCTOR_TAG):
            report = json.loads(line[len(DOCTOR_TAG) :])
            _doctors[key] = (time.monotonic(), report)
            return report
    last = "\n".join(logs.strip().splitlines()[-5:])
    raise RunError(
        f"ortlab's doctor could not run on {spec.target.cluster} (is ortlab installed on its workers? "
        f"pip install ortlab[remote] there):\n{last}"
    )


class RayJob(Launcher):
    kind = "ray-job"

    def doctor(self, spec: Any) -> dict[str, Any]:
        return cluster_doctor(spec)

    def check(self, spec: Any) -> dict[str, Any]:
        """Check the spec against the cluster, before anything is created: reachable, authenticated, enough GPUs,
        and every acceleration asked for available there (the cluster's doctor, not this machine's)."""
        storage = storage_for(spec)
        if isinstance(storage, Store):  # this machine's side of the storage (the doctor job checks the cluster's)
            try:
                storage.probe()
            except RunError as e:
                raise RunError(
                    f"target.storage: this machine {e} (the monitor brings the results home through it; check "
                    "this machine's credentials for the store, e.g. AWS_ACCESS_KEY_ID, and the bucket)"
                ) from None
        report = cluster_doctor(spec)
        problems = resource_problems(spec, report) + self.shape_problems(spec)
        if isinstance(storage, Store) and report.get("storage") != "ok":
            problems.append(
                f"target.storage: a job on the cluster {report.get('storage') or 'could not check the storage'} "
                "(the workers write checkpoints and the model there; check the cluster's credentials for the store)"
            )
        problems += mix_problems(spec, report["accelerations"], f"the cluster {spec.target.cluster}")
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
        return f"-m {CHANNEL} worker {remote}"

    def job_resources(self, spec: Any) -> dict[str, Any]:
        """What the job's entrypoint reserves on the cluster: here, the one training process's CPUs and GPUs."""
        return _resources(spec)

    def start(self, run: RunDir, spec: Any, resume: bool = False, cwd: str | None = None) -> subprocess.Popen:
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
                raise RunError(
                    f"run {run.id} could not resume: its previous job {launcher['job_id']} is still {previous} on the "
                    f"cluster; stop it first (ray job stop {launcher['job_id']})"
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
        elif isinstance(storage, Store):
            remote = StoredRun(storage.child(run.id))
            while remote.store.exists("spec.yaml"):  # (unique as below, by a suffix)
                remote = StoredRun(storage.child(f"{run.id}-{secrets.token_hex(3)}"))
            remote.create(safeio.read_bytes(run.path, "spec.yaml"))
        else:
            # Run ids are unique in their runs folder, not in a storage that runs from several folders share.
            storage.mkdir(parents=True, exist_ok=True)
            remote = RunDir(storage / run.id)
            while True:
                try:
                    remote.path.mkdir()
                    break
                except FileExistsError:
                    remote = RunDir(storage / f"{run.id}-{secrets.token_hex(3)}")
            (remote.path / "logs").mkdir()
            (remote.path / "control").mkdir()
            shutil.copy2(run.spec_path, remote.spec_path)
            remote.set_status("pending")
        pause = run.read_pause()
        if pause is not None:  # a gate set before the start holds the remote run from its first step
            remote.request_pause(int(pause) if pause.isdigit() else None)
        python, runtime_env = _python_for(spec)
        where = remote.path if isinstance(remote, StoredRun) else remote.path.resolve()
        entry = f"{python} {self.entrypoint(spec, shlex.quote(str(where)))}"
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
                    *(sys.executable, "-m", CHANNEL, "monitor", str(run.path.resolve())),
                    *("--cluster", spec.target.cluster),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                start_new_session=True,  # outlives the kernel: a restart loses nothing
            )
        run.update_status(pid=proc.pid, create_time=process_create_time(proc.pid))
        return proc

    def terminate(self, run: RunDir, status: dict[str, Any]) -> None:
        launcher = status.get("launcher") if isinstance(status.get("launcher"), dict) else {}
        job = launcher.get("job_id", "JOB_ID")
        raise RunError(
            f"run {run.id} did not stop when asked: its Ray job may still be running. Stop it on the cluster with "
            f"`ray job stop {job}`; its monitor then records the end"
        )

    def bring_home(self, run: RunDir) -> None:
        Monitor(run.path, cluster="").bring_home()
