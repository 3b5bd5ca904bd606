"""Runs: training in its own process, watched through its run folder.

    run = ortlab.launch(spec)              # returns at once; the kernel stays free
    for record in run.follow(): ...        # the history, then live records until the run ends
    run.stop(); run.resume(); run.wait()
    ortlab.runs(); ortlab.attach(run_id)   # from any process, e.g. a fresh kernel after a restart

Nothing but the run process holds training state: every view reads the run folder (`ortlab.runfolder.rundir`), so
a kernel restart loses nothing, and several runs can go at once (own folders, own ports, own processes).
Importing this module stays light (no torch): the run process does the heavy imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ortlab.cluster import ADDRESSES_ENV, is_configured
from ortlab.envvars import child_env
from ortlab.errors import OrtlabError
from ortlab.netutil import LOOPBACK, free_port
from ortlab.runfolder.rundir import (
    DAMAGED,
    TERMINAL,
    RunDir,
    RunStateError,
    process_create_time,
    resolve,
)
from ortlab.runfolder.stream import MetricsStream

DEFAULT_ROOT = "ortlab-runs"
# Interpreters (absolute paths separated by os.pathsep) a run folder's target.python may name on resume.
TRUSTED_PYTHONS_ENV = "ORTLAB_TRUSTED_PYTHONS"
# How long a status may stay unreadable (missing, or not JSON) before follow/wait give up with the reason.
UNREADABLE_GRACE_S = 10.0


def default_root() -> Path:
    """Where runs live unless a spec says otherwise: $ORTLAB_RUNS, else ./ortlab-runs."""
    return Path(os.environ.get("ORTLAB_RUNS", DEFAULT_ROOT))


class RunError(OrtlabError, RuntimeError):
    """A run operation that cannot be done in the run's current state (the message says why)."""


class Run:
    """A handle on one run folder. Cheap; any number of handles (in any processes) may watch the same run."""

    def __init__(self, path: str | os.PathLike):
        self.dir = RunDir(path)
        self._process: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        return self.dir.id

    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def state(self) -> str:
        return self.status()["state"]

    def status(self) -> dict[str, Any]:
        if self._process is not None:
            self._process.poll()  # reap our own child so that a dead run is not seen as a zombie
        return self.dir.status()

    def spec(self):
        from ortlab.spec import RunSpec

        return RunSpec.from_run(self.dir)

    def metrics(self) -> list[dict[str, Any]]:
        return self.dir.metrics()

    def result(self) -> dict[str, Any] | None:
        return self.dir.result()

    def follow(
        self, callback: Callable[[dict], None] | None = None, poll_s: float = 0.5, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every metrics record: those written so far, then new ones as they come, until the run ends.

        Use as an iterator (`for r in run.follow()`), or pass `callback` and exhaust it (`list(...)`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        stream = MetricsStream(self.path)
        unreadable = _Unreadable(self)
        while True:
            # The run writes its last metrics before its final status: once the status says it ended, one more
            # read has every line.
            state = unreadable.check(self.status())
            ended = state in TERMINAL
            before = stream.offset
            for record in stream.records():  # bounded per call: a long history comes a chunk at a time
                if callback is not None:
                    callback(record)
                yield record
            moved = stream.offset != before  # (a torn last line never completes: an ended run stops there)
            if (ended and not moved) or (deadline is not None and time.monotonic() > deadline):
                return
            if not moved:
                time.sleep(poll_s)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Block until the run ends (or `timeout` s); returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        unreadable = _Unreadable(self)
        while True:
            status = self.status()
            unreadable.check(status)
            if status["state"] in TERMINAL:
                if self._process is not None:
                    self._process.wait()
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} is still {status['state']} after {timeout} s")
            time.sleep(poll_s)

    def stop(self, timeout: float = 300.0) -> dict[str, Any]:
        """Graceful stop: the run finishes its current step, saves a checkpoint and exits as `stopped`.

        If it has not stopped within `timeout` seconds, it is terminated (and ends `failed`).
        """
        status = self.status()
        if status["state"] in TERMINAL:
            return status
        if status["state"] == DAMAGED:
            raise RunError(f"run {self.id} is damaged: nothing was signalled, nothing asked of it: {status[DAMAGED]}")
        try:
            self.dir.request_stop()
        except OSError as e:
            raise RunError(f"run {self.id}: cannot ask for a stop ({e}); nothing was signalled") from None
        try:
            return self.wait(timeout=timeout)
        except TimeoutError:
            status = self.status()
            if status["state"] in TERMINAL:
                return status
            if not _is_run_process(self.dir, status):
                raise RunError(
                    f"run {self.id} did not stop within {timeout:.0f} s, and the process its status.json names "
                    f"(pid {status.get('pid')}) is not this run's worker: nothing was signalled. Look at the run's "
                    "logs/run.log and end its process yourself"
                ) from None
            _signal_group(status["pid"], signal.SIGTERM)
            time.sleep(5)
            if _is_run_process(self.dir, status):
                _signal_group(status["pid"], signal.SIGKILL)
            return self.wait(timeout=30)

    def pause(self, at_step: int | None = None) -> None:
        """Hold the run after its current step (or once `at_step` steps are done) until `unpause()`.

        The run keeps its memory and stays `running`; its status says `paused` while it waits. `at_step` makes a
        deterministic gate: the run holds exactly there, however fast the machine is.
        """
        self.dir.request_pause(at_step)

    def unpause(self) -> None:
        self.dir.clear_pause()

    def resume(self, python: str | None = None, cluster: str | None = None) -> Run:
        """Continue a stopped (or failed) run from its last checkpoint, in a new run process.

        Exclusive: the run is claimed (`pending`) under its status lock, so a second `resume` of the same run,
        from this or any other process, is refused instead of starting a second worker on one folder.

        A run folder is not trusted (it may come from anyone): the interpreter its spec names (`target.python`) is
        started only when it is this one, one of ortlab's runtimes, or one listed in $ORTLAB_TRUSTED_PYTHONS; the
        Ray token goes only to 'local' or an address in $ORTLAB_RAY_ADDRESSES. Otherwise RunError says how to allow
        it: `python=` / `cluster=` resume in the interpreter / on the cluster you name here instead of the folder's.
        """
        spec = self.spec()
        if self.dir.last_checkpoint() is None:
            state = self.status()["state"]
            if state not in ("stopped", "failed"):
                raise RunError(f"run {self.id} is {state}: only a stopped or failed run can resume")
            raise RunError(f"run {self.id} has no checkpoint to resume from (it stopped before its first save)")
        spec = _trusted_target(self.id, spec, python=python, cluster=cluster)
        if not spec.target.python and not spec.target.cluster:
            from ortlab.spec import RunSpec

            RunSpec.parse(spec.model_dump(mode="json"))  # the stored mix, checked against this machine
        # A run folder may name an interpreter, and the mix may need ortlab's compile runtime: check it first.
        _prepare(spec)
        self.status()  # a dead 'running' run becomes 'failed' (and so resumable) here
        try:
            # Claimed with its stop and pause requests cleared under the status lock: a stop asked for once the
            # run shows `pending` reaches the new worker (see RunDir.claim).
            self.dir.claim(pid=None, create_time=None, resumed=True)
        except RunStateError:
            state = self.dir.read_status().get("state")
            raise RunError(
                f"run {self.id} is {state}: only a stopped or failed run can resume "
                "(a second resume of the same run is refused)"
            ) from None
        except OSError as e:  # a planted link in control/ or at .status.lock
            raise RunError(f"run {self.id} is damaged and cannot resume: {e}") from None
        self._process = _start(self.dir, spec, resume=True)
        return self

    def export_onnx(self, **kwargs: Any):
        """Export the finished model to ONNX with a parity check and latency numbers (see ortlab.export)."""
        from ortlab.export import export_onnx

        return export_onnx(self.dir, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs: Any):
        """Publish model, tokenizer, ONNX files and a model card (see ortlab.publish)."""
        from ortlab.publish import push_to_hub

        return push_to_hub(self.dir, repo_id, **kwargs)

    def compare(self, *others: Run) -> list:
        from ortlab.runfolder.compare import compare

        return compare([self.dir, *[o.dir for o in others]])


class _Unreadable:
    """Ends a follow/wait whose status has been unreadable (missing, or damaged) for UNREADABLE_GRACE_S."""

    def __init__(self, run: Run):
        self.run = run
        self.since: float | None = None

    reason = ""

    def check(self, status: dict[str, Any]) -> str:
        state = status["state"]
        if state not in ("missing", DAMAGED):
            self.since = None
            return state
        self.reason = status.get(DAMAGED, "")
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since > UNREADABLE_GRACE_S:
            what = "is missing" if state == "missing" else f"cannot be trusted: {self.reason}"
            raise RunError(
                f"run {self.run.id}: {self.run.dir.status_path} {what} (for {UNREADABLE_GRACE_S:.0f} s); the run "
                "folder was removed or damaged: look at its logs/run.log"
            )
        return state


def _is_run_process(run: RunDir, status: dict[str, Any]) -> bool:
    """Is the recorded pid still this run's launched worker (same create time, a worker of this very folder,
    leading its own process group), so that signalling its group reaches the run and nothing else?

    A pid from status.json alone is not enough before sending a signal: the process may have ended and the
    pid been reused by anything, or the file may have been edited (see `rundir.run_process`).
    """
    import psutil

    pid = status.get("pid")
    if not run.owns_process(status):
        return False
    try:
        cmdline = psutil.Process(pid).cmdline()
        group = os.getpgid(pid)
    except (psutil.Error, OSError):
        return False
    launched = "ortlab.runner.worker" in cmdline and str(run.path.resolve()) in cmdline
    return launched and group == pid  # started with start_new_session: the group is the worker's own


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def runtime_for(spec: Any) -> tuple[str, str | None]:
    """(interpreter, ortlab runtime name) that a run of `spec` starts in, without checking it.

    `target.python` when the spec names one; else ortlab's compile runtime when the mix needs it (torch_compile
    in the ORT runtime: `ortlab.accel.mix.runtime_for`); else this interpreter. Raises RunError when the
    runtime the mix needs is not built, with the command that builds it.
    """
    if spec.target.python:
        return str(spec.target.python), None
    from ortlab.accel.mix import runtime_for as mix_runtime

    name = mix_runtime(spec.mix())
    if name is None:
        return sys.executable, None
    from ortlab.runtimes import _inspect

    state = _inspect(name)
    if state.python is None:
        raise RunError(f"this run asks for torch_compile, which needs ortlab's {name} runtime, but {state.why}")
    return str(state.python), name


def python_trusted(python: str) -> bool:
    """Is `python` an interpreter this machine's user vouches for: this one, one of ortlab's runtimes, or one
    listed in $ORTLAB_TRUSTED_PYTHONS?

    Paths are compared as written (made absolute, links not resolved): a venv's `bin/python` is a link to the
    base interpreter, and the same binary started through another folder's link reads that folder's
    `pyvenv.cfg` and site-packages, so "the same file" is not "the same interpreter".
    """
    from ortlab.runtimes import RUNTIMES, python_for

    wanted = os.path.abspath(python)
    known = [sys.executable, *(str(p) for p in map(python_for, RUNTIMES) if p is not None), *trusted_pythons()]
    return any(os.path.abspath(k) == wanted for k in known)


def trusted_pythons() -> list[str]:
    """The interpreters listed in $ORTLAB_TRUSTED_PYTHONS (absolute paths, separated by os.pathsep)."""
    return [p for p in os.environ.get(TRUSTED_PYTHONS_ENV, "").split(os.pathsep) if p.strip()]


def _trusted_target(run_id: str, spec: Any, python: str | None = None, cluster: str | None = None) -> Any:
    """The spec a resumed run starts with: its folder's, whose interpreter and cluster address must be ones the
    user vouches for on this machine, or the folder's with the interpreter / address the user names here.

    Why here and not in RunSpec: a spec is the same value whoever wrote it; what differs is who named it. The
    spec given to `launch` is the user's own (its target.python and target.cluster are used as given); the one
    in a run folder may come from anyone (copied, cloned, unpacked, planted in the server's runs root), and
    resume would otherwise start the program it names and send the user's Ray token to the address it names.
    """
    from ortlab.spec import RunSpec, SpecError

    target = spec.target
    if python is not None or cluster is not None:
        if python is not None and cluster is not None:
            raise RunError("resume: python and cluster exclude each other (a cluster run uses the cluster's python)")
        if python is not None and target.cluster:
            raise RunError(f"run {run_id} runs on the cluster {target.cluster!r}: resume it with cluster=, not python=")
        if cluster is not None and not target.cluster:
            raise RunError(f"run {run_id} runs on this machine: resume it without cluster= (or with python=)")
        data = spec.model_dump(mode="json")
        data["target"]["python" if python is not None else "cluster"] = python if python is not None else cluster
        try:
            return RunSpec.parse(data, stored=True)
        except SpecError as e:
            raise RunError(str(e)) from None
    if target.python and not python_trusted(target.python):
        raise RunError(
            f"run {run_id}: its spec.yaml names the interpreter {target.python!r} (target.python), and ortlab does not "
            "start a program that a run folder names (a folder may come from anyone). If you trust it, name it "
            f"yourself: `ortlab resume {run_id} --python PATH` or `Run.resume(python=PATH)`, or list it in "
            f"${TRUSTED_PYTHONS_ENV} (absolute paths separated by {os.pathsep!r}; for the Jupyter server, set it "
            "before starting the server)"
        )
    if target.cluster and not is_configured(target.cluster):
        raise RunError(
            f"run {run_id}: its spec.yaml names the Ray cluster {target.cluster!r} (target.cluster), and ortlab sends "
            "your Ray token only to an address you named on this machine ('local', or one listed in "
            f"${ADDRESSES_ENV}). If you trust it, name it yourself: `ortlab resume {run_id} --cluster ADDRESS` or "
            f"`Run.resume(cluster=ADDRESS)`, or list it in ${ADDRESSES_ENV} (for the Jupyter server, set it before "
            "starting the server)"
        )
    return spec


def _prepare(spec: Any) -> None:
    """Check the interpreter `runtime_for` picks for `spec` before anything starts there (see check_runtime).
    A run for a cluster is checked there instead, by the cluster's own doctor (`ortlab.runner.remote`).

    `spec` is one whose target.python and target.cluster the user named: `launch`'s spec, or a resumed folder's
    after `_trusted_target`. Its interpreter is started here, and its cluster is sent the user's Ray token."""
    if spec.target.cluster:
        from ortlab.runner import remote

        remote.prepare(spec)
        return
    python, runtime = runtime_for(spec)
    if spec.target.python:
        check_runtime(spec)
    elif runtime is not None:
        # Built by ortlab (its stamp says it imported torch, transformers and ortlab): only the mix is checked.
        _check_mix(spec, python)


def check_runtime(spec: Any) -> dict[str, Any]:
    """Check the interpreter a spec names (`target.python`) before anything starts in it, and its mix there.

    Only an interpreter the user named reaches this (a run folder's is refused first, see `_trusted_target`), but
    a typo or a broken environment should fail here, in seconds, not in the run: the file must exist and be
    executable, be a Python that can import ortlab's dependencies, and its own doctor must say that every
    acceleration the spec asks for runs there. Raises RunError naming what is wrong.
    """
    python = str(spec.target.python)
    path = Path(python)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RunError(f"target.python: {python!r} is not an executable file; give the path of a Python interpreter")
    probe = "import sys, torch, transformers, ortlab; print(sys.version_info[0])"
    try:
        out = subprocess.run(
            [python, "-c", probe],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunError(f"target.python: {python!r} could not be started: {e}") from None
    if out.returncode != 0 or out.stdout.strip().splitlines()[-1:] != ["3"]:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise RunError(
            f"target.python: {python!r} is not a Python that can run ortlab ({last}); install ortlab's "
            "dependencies there (`pip install ortlab`) or pick another interpreter"
        )
    return _check_mix(spec, python)


def _check_mix(spec: Any, python: str) -> dict[str, Any]:
    """The doctor of `python` (cached per environment) must accept every acceleration the spec asks for."""
    from ortlab.probe import doctor

    report = doctor(python)
    problems = _mix_problems(spec, report.to_dict()["accelerations"], python)
    if problems:
        raise RunError("this mix cannot run in the target runtime:\n" + "\n".join(f"  - {p}" for p in problems))
    return report.to_dict()


def _mix_problems(spec: Any, accelerations: dict[str, dict[str, Any]], where: str) -> list[str]:
    """One line per acceleration the spec asks for explicitly that a doctor's report (`to_dict()` form, so a
    report from another machine works too) says is not available `where`."""
    from ortlab.accel.mix import Mix

    # What the spec asks for explicitly ('auto' resolves in the target runtime itself, when the run starts).
    a = spec.accel
    wanted = Mix(
        ort=a.ort is True,
        fused_adam=a.fused_adam is True,
        zero_stage=a.zero_stage,
        precision=a.precision,
        torch_compile=a.torch_compile,
        tf32=a.tf32 is True,
    ).requested()
    unknown = {"reason": "its doctor does not know this acceleration", "remedy": "install the same ortlab there"}
    found = {name: accelerations.get(name) or unknown for name in wanted}
    return [
        f"accel: {name} is not available in {where}: {found[name]['reason']}. Fix: {found[name]['remedy']}"
        for name, on in wanted.items()
        if on and not found[name].get("available", False)
    ]


def _start(run: RunDir, spec: Any, resume: bool = False) -> subprocess.Popen:
    """Start the worker of a claimed (`pending`) run folder; a start that fails ends the run `failed`.

    It starts in the interpreter `runtime_for` picks (checked before by `_prepare`); status.json records the
    ortlab runtime ortlab chose ("current" when it runs where the spec says), beside the interpreter the worker
    itself records when it starts.
    """
    if spec.target.cluster:
        from ortlab.runner import remote

        return remote.start(run, spec, resume=resume)
    python, runtime = runtime_for(spec)
    worker = ["-m", "ortlab.runner.worker", str(run.path.resolve()), *(["--resume"] if resume else [])]
    if spec.target.processes > 1:
        cmd = [
            python,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={spec.target.processes}",
            f"--master_addr={LOOPBACK}",  # one machine: rendezvous on loopback only
            f"--master_port={free_port()}",
            *worker,
        ]
    else:
        cmd = [python, *worker]
    # Opened without following a link: a planted logs/run.log link would get the run's output appended elsewhere.
    with os.fdopen(run.open_log(), "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        try:
            # Its own session: a stop or kill reaches the whole group (torchrun and its workers), and a notebook
            # interrupt (SIGINT to the kernel's group) does not reach the run.
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                cwd=os.getcwd(),
                start_new_session=True,
            )
        except OSError as e:
            run.set_status("failed", error=f"the run process could not be started: {e} (command: {cmd[0]})", step=0)
            raise RunError(f"run {run.id} could not start: {e}") from None
    run.update_status(
        pid=proc.pid, create_time=process_create_time(proc.pid), launcher=cmd[:3], runtime=runtime or "current"
    )
    return proc


def launch(spec: Any = None, root: str | os.PathLike | None = None, **overrides: Any) -> Run:
    """Start `spec` (a RunSpec, a dict, or a YAML/JSON path; default: the embedded default) in its own process.

    The spec is validated here (instantly; a spec for another interpreter is checked by that interpreter's
    doctor). A spec that asks for torch_compile where this runtime cannot compile runs in ortlab's compile
    runtime (`ortlab runtime create compile`), recorded as `runtime` in status.json. The model and data checks
    run in the run process and a problem there ends the run `failed` with the message. Returns at once.
    """
    from ortlab.spec import RunSpec

    if spec is None:
        spec = RunSpec()
    elif isinstance(spec, (str, Path)):
        spec = RunSpec.load(spec)
    elif isinstance(spec, dict):
        spec = RunSpec.parse(spec)
    if overrides:
        spec = RunSpec.parse({**spec.model_dump(mode="json"), **overrides})
    _prepare(spec)  # another interpreter is checked before the run folder exists
    run_dir = RunDir.create(root or spec.output_dir, spec)
    run = Run(run_dir.path)
    run._process = _start(run_dir, spec)
    return run


def runs(root: str | os.PathLike | None = None) -> list[Run]:
    """All runs under `root` (default ./ortlab-runs), oldest first. Symbolic links are not followed."""
    base = Path(root) if root else default_root()
    if not base.is_dir():
        return []
    # A folder whose status.json is there in any form (a link, a FIFO included) is listed: it shows as damaged.
    found = [Run(p) for p in base.iterdir() if not p.is_symlink() and p.is_dir() and _has_status(p)]
    return sorted(found, key=lambda r: (r.path.stat().st_ctime, r.id))


def _has_status(folder: Path) -> bool:
    return os.path.lexists(folder / "status.json")


def attach(run_id: str | os.PathLike, root: str | os.PathLike | None = None) -> Run:
    """A handle on an existing run, by id (its folder name under `root`), e.g. after a kernel restart.

    An id is a name (`..`, absolute paths and symbolic links out of the runs folder are refused), so an id from
    a URL, a CLI argument or a file cannot open anything else. A path to a run folder (`runs/my-run`, what tab
    completion gives) is accepted too: inside `root` when a root is given, else its parent is the runs folder.
    """
    if isinstance(run_id, (str, os.PathLike)) and ("/" in str(run_id) or os.sep in str(run_id)):
        path = Path(str(run_id).rstrip("/" + os.sep))
        if path.is_symlink():
            raise RunError(f"{str(run_id)!r} is a symbolic link; ortlab only opens real run folders")
        if root is not None and path.resolve().parent != Path(root).resolve():
            raise RunError(f"{str(run_id)!r} is not a run folder inside the runs folder {str(root)!r}")
        root, run_id = root if root is not None else path.parent, path.name
    base = Path(root) if root else default_root()
    try:
        candidate = resolve(base, str(run_id))
    except ValueError as e:
        raise RunError(str(e)) from None
    if not _has_status(candidate):
        known = ", ".join(r.id for r in runs(base)) or "none"
        raise RunError(f"no run {str(run_id)!r} (runs under {base}: {known})")
    return Run(candidate)
