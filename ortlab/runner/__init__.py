"""Driver side: runs, each training in its own process and watched through its run folder.

    run = ortlab.launch(spec)              # returns at once; the kernel stays free
    for record in run.follow(): ...        # the history, then live records until the run ends
    run.stop(); run.resume(); run.wait()
    ortlab.runs(); ortlab.attach(run_id)   # from any process, e.g. a fresh kernel after a restart

Nothing but the run process holds training state: every view reads the run folder (`ortlab.runfolder`), so a
kernel restart loses nothing, and several runs can go at once (own folders, own ports, own processes).
Importing this module stays light (no torch): the run process does the heavy imports.

Where a run goes is its launcher's business (`ortlab.runner.launcher`: this very process in `foreground.py`, a
process on this machine in `local.py`, a Ray job in `rayjob.py`); `launch` and `Run` ask it for its preflight, to
start, terminate and bring home, and read everything else from the local run folder, whatever the target. Which
interpreter or cluster a run folder may name on resume is decided in `trust.py`.

A launch is one call for every face: `launch(spec)` picks the spec's launcher (`launcher_for`); a caller that
waits for the run in its own process (`ortlab train`) passes the one it was given (`launch(spec, launcher=...)`),
never a branch of its own on the launcher's class. The launchers are imported when one is asked for: a face that
lists, follows or stops runs never loads the foreground's trainer nor Ray's client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ortlab.runfolder import vouch
from ortlab.runfolder.naming import check_output_folder, run_folder
from ortlab.runfolder.rundir import (
    DAMAGED,
    RESUMABLE,
    TERMINAL,
    RunDir,
    RunStateError,
)
from ortlab.runfolder.stream import MetricsStream
from ortlab.runner.launcher import Launcher, RunError
from ortlab.runner.trust import storage_named, trusted_target
from ortlab.spec import RunSpec, SpecError

DEFAULT_ROOT = "ortlab-runs"
# How long a status may stay unreadable (missing, or not JSON) before follow/wait give up with the reason.
UNREADABLE_GRACE_S = 10.0


def default_root() -> Path:
    """Where runs live unless a spec says otherwise: $ORTLAB_RUNS, else ./ortlab-runs."""
    return Path(os.environ.get("ORTLAB_RUNS", DEFAULT_ROOT))


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
        return RunSpec.from_run(self.dir)

    def metrics(self) -> list[dict[str, Any]]:
        return self.dir.metrics()

    def result(self) -> dict[str, Any] | None:
        return self.dir.result()

    def follow(
        self,
        callback: Callable[[dict], None] | None = None,
        poll_s: float = 0.5,
        timeout: float | None = None,
        offset: int = 0,
    ) -> Iterator[dict[str, Any]]:
        """Every metrics record: those written so far, then new ones as they come, until the run ends.

        Use as an iterator (`for r in run.follow()`), or pass `callback` and exhaust it (`list(...)`). `offset`:
        start after that byte of the metrics file (a view that read the history in one pass follows on from there).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        stream = MetricsStream(self.path, offset)
        unreadable = _Unreadable(self)
        while True:
            # The run writes its last metrics before its final status: once the status says it ended, one more
            # read has every line.
            state = unreadable.state_within_grace(self.status())
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
            unreadable.state_within_grace(status)
            if status["state"] in TERMINAL:
                if self._process is not None:
                    self._process.wait()
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} is still {status['state']} after {timeout} s")
            time.sleep(poll_s)

    def stop(self, timeout: float = 300.0) -> dict[str, Any]:
        """Graceful stop: the run finishes its current step, saves a checkpoint and exits as `stopped`.

        If it has not stopped within `timeout` seconds, its launcher terminates it (it ends `failed`), or says what
        to do where it cannot (a Ray job is stopped on the cluster).
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
            try:
                launcher = launcher_for(self.spec())
            except SpecError:  # spec.yaml damaged meanwhile: Local signals only a process shown to be this worker
                from ortlab.runner.local import Local

                launcher = Local()
            launcher.terminate(self.dir, status)  # RunError when it cannot, saying why
            return self.wait(timeout=30)

    def pause(self, at_step: int | None = None) -> None:
        """Hold the run after its current step (or once `at_step` steps are done) until `unpause()`.

        The run keeps its memory and stays `running`; its status says `paused` while it waits. `at_step` makes a
        deterministic gate: the run holds exactly there, however fast the machine is.
        """
        self.dir.request_pause(at_step)

    def unpause(self) -> None:
        self.dir.clear_pause()

    def resume(
        self, python: str | None = None, cluster: str | None = None, cwd: str | None = None, hub_token: bool = False
    ) -> Run:
        """Continue a stopped (or failed) run from its last checkpoint, in a new run process.

        Exclusive: the run is claimed (`pending`) under its status lock, so a second `resume` of the same run,
        from this or any other process, is refused instead of starting a second worker on one folder.

        A run folder is not trusted (it may come from anyone): the interpreter its spec names (`target.python`) is
        started only when it is this one, one of ortlab's runtimes, or one listed in $ORTLAB_TRUSTED_PYTHONS; the
        Ray token goes only to 'local' or an address in $ORTLAB_RAY_ADDRESSES. Otherwise RunError says how to allow
        it: `python=` / `cluster=` resume in the interpreter / on the cluster you name here instead of the folder's.

        A folder the user launched carries their mark (`ortlab.runfolder.vouch`) and resumes as launched, without
        these gates. Any other is a stranger's: besides the gates, the Hub models and data its spec names are
        fetched without the user's Hub token, unless `hub_token=True` (`--hub-token`) says to send it.
        """
        spec = self.spec()
        if self.dir.last_checkpoint() is None:
            state = self.status()["state"]
            if state not in RESUMABLE:
                raise RunError(f"run {self.id} is {state}: only a stopped or failed run can resume")
            raise RunError(f"run {self.id} has no checkpoint to resume from (it stopped before its first save)")
        # A folder the user launched carries their mark (runfolder.vouch); any other is a stranger's, gated.
        vouched = vouch.marked(self.dir)
        spec = trusted_target(self.id, spec, python=python, cluster=cluster, vouched=vouched)
        hub_token = vouched or hub_token
        preflight(spec)  # the stored mix, against the target it resumes on (a fp16 run on a machine without CUDA...)
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
        self._process = _start(self.dir, spec, resume=True, cwd=cwd, hub_token=hub_token)
        return self

    def bring_home(self) -> None:
        """Copy what the run made on its target (model, result, the last checkpoint) into this run folder. A Ray
        job's monitor does this when the job ends; call it when the monitor could not (it died, the machine slept).
        Nothing to do for a run on this machine, which writes here itself."""
        launcher_for(self.spec()).bring_home(self.dir)

    def export_onnx(self, **kwargs: Any):
        """Export the finished model to ONNX with a parity check and latency numbers (see ortlab.export). A causal
        LM is exported with its KV cache (`cache=True`, the default; `cache=False` for the graph without it), its
        greedy generations checked against PyTorch's; `ortlab.export.OnnxGenerator(run.path / "onnx")` streams
        tokens from it."""
        from ortlab.export import export_onnx

        return export_onnx(self.dir, **kwargs)

    def chat(self, other: Run | str | os.PathLike | None = None, **kwargs: Any):
        """A chat playground in the notebook: this run's model beside its base model (or beside `other`: a Run, a
        run folder or an id in the same runs folder), the same prompts to both, streamed; each model in a child
        process, so the kernel stays free (see ortlab.ui.playground). Needs `ortlab[ui,serve]`."""
        from ortlab.ui.playground import Playground  # the one face the handle opens (pyproject: ignore_imports)

        return Playground(self, other, **kwargs)

    def export_gguf(self, quant: str | list[str] = "q8_0", **kwargs: Any):
        """Export a finished causal LM (llama family; a LoRA adapter merged first) to GGUF for llama.cpp and Ollama,
        each file checked against the trained model, with an Ollama Modelfile: <run>/gguf/ (see ortlab.export)."""
        from ortlab.export import export_gguf

        return export_gguf(self.dir, quant=quant, **kwargs)

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

    def state_within_grace(self, status: dict[str, Any]) -> str:
        """`status`'s state; RunError once it has been unreadable for longer than the grace (a status being
        replaced reads as missing for a moment; one removed or damaged for good ends the follow or wait)."""
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


def launcher_for(spec: Any, here: bool = False) -> Launcher:
    """The launcher of `spec`'s target (see `ortlab.runner.launcher`): a Ray job for one process on a cluster
    (`target.cluster`), Ray Train for several; else a process on this machine (any interpreter, any number of
    processes). `here`: the caller waits for the run in this process (`ortlab train`), so a spec that can train in
    this very process (on this machine, in this interpreter, not another Python nor ortlab's compile runtime, as
    one process) trains here: the foreground launcher (`Launcher.in_process`). Written out, not registered: there
    are four. Each is imported here, when asked for: Ray's client and the trainer load only for a run that needs
    them."""
    if spec.target.cluster:
        if spec.target.processes > 1:
            from ortlab.runner.raytrainjob import RayTrain

            return RayTrain()
        from ortlab.runner.rayjob import RayJob

        return RayJob()
    from ortlab.runner.local import Local

    local = Local()
    if here and spec.target.processes == 1 and local.interpreter(spec) == (sys.executable, None):
        from ortlab.runner.foreground import Foreground

        return Foreground()
    return local


def preflight(spec: Any, launcher: Launcher | None = None) -> dict[str, Any] | None:
    """Can `spec` run where it says? The launch's pre-flight of a spec against its target, for every face: the mix
    against the target's own doctor (this interpreter's, ortlab's compile runtime's, a named Python's, or the
    cluster's), the packages it needs there, the cluster's resources. Raises RunError listing every problem with its
    fix; returns the doctor's report. Neither imports torch here: the doctors run in their own processes, and cache
    their answer.

    `spec` is one whose target.python and target.cluster the user named: `launch`'s, or a resumed folder's after
    `trust.trusted_target` (a named interpreter is started here, and a cluster is sent the user's Ray token).
    `launcher`: the one the run goes to, when the caller chose it (`launch(spec, launcher=...)`).

    First, for a run on this machine, its predicted peak memory against the machine's (`ortlab.estimator.fits`,
    about a second: no weights, a sample of the data): a run that cannot fit is refused with the numbers and the
    remedies, before the foreground launcher's preflight loads the data and long before any model loads."""
    if not spec.target.cluster:  # (a cluster's nodes are not this machine: their memory is not known here)
        from ortlab.estimator.fits import DoesNotFit, check

        try:
            check(spec)
        except DoesNotFit as e:
            raise RunError(f"this run cannot start here:\n{e}") from None
    return (launcher or launcher_for(spec)).preflight(spec)


def fit_to_budget(spec: Any) -> Any:
    """`spec` fitted to its `budget` (`ortlab.estimator.budget.fit_spec_budget`), with what was changed in
    `budget.fitted`; RunError naming the closest budget that would fit when none does, or why a budget cannot be
    fitted here (a cluster run)."""
    from ortlab.estimator import EstimateError
    from ortlab.estimator.budget import BudgetError, fit_spec_budget

    try:
        fitted = fit_spec_budget(spec)
    except (BudgetError, EstimateError) as e:
        raise RunError(str(e)) from None
    return fitted.spec.model_copy(update={"budget": spec.budget.model_copy(update={"fitted": fitted.choices})})


def target_doctor(spec: Any) -> dict[str, Any]:
    """The doctor's report of where `spec` would run (this machine's interpreter, a runtime, the cluster), judging
    nothing: what the workbench shows beside its toggles when the target changes."""
    return launcher_for(spec).doctor(spec)


def _start(
    run: RunDir,
    spec: Any,
    resume: bool = False,
    cwd: str | None = None,
    hub_token: bool = True,
    launcher: Launcher | None = None,
) -> subprocess.Popen | None:
    """Start the worker of a claimed (`pending`) run folder on its target (its preflight passed before), with
    `launcher` where the caller chose it. `hub_token=False`: its Hub downloads go without the user's token (a
    folder from elsewhere, resumed)."""
    launcher = launcher or launcher_for(spec)
    return launcher.start(run, spec, resume=resume, cwd=cwd, hub_token=hub_token)


def launch(
    spec: Any = None,
    root: str | os.PathLike | None = None,
    cwd: str | os.PathLike | None = None,
    launcher: Launcher | None = None,
    **overrides: Any,
) -> Run:
    """Start `spec` (a RunSpec, a dict, or a YAML/JSON path; default: the embedded default) on its target.

    One call for every face, in three steps: the launcher's preflight (the target's doctor, cached) before the run
    folder exists, so a refused launch leaves nothing behind; the run folder; the start. `launcher`: the one to use
    instead of the spec's own (`launcher_for(spec)`): `ortlab train` passes the foreground launcher, with its view,
    when the run can train in its process (`launcher_for(spec, here=True)`). A spec that asks for torch_compile
    where this runtime cannot compile runs in ortlab's compile runtime (`ortlab runtime create compile`), recorded
    as `runtime` in status.json. The model and data checks run once, where the run trains: in the run process, where
    a problem ends the run `failed` with the message, or, in the foreground, in the preflight (kept for the start,
    so the data is loaded once). Returns once the run's process has started (the foreground: once the run has
    ended). `cwd`: the folder relative paths in the spec are relative to (default: this process's; the Jupyter
    server passes its root folder, where its file browser starts).
    """
    if spec is None:
        spec = RunSpec()
    elif isinstance(spec, (str, Path)):
        spec = RunSpec.load(spec)
    elif isinstance(spec, dict):
        spec = RunSpec.parse(spec)
    if overrides:
        spec = RunSpec.parse({**spec.model_dump(mode="json"), **overrides})
    check_output_folder(root or spec.output_dir)  # first: before the machine, model and data checks
    if spec.budget.asked:
        spec = fit_to_budget(spec)
    launcher = launcher or launcher_for(spec)
    preflight(spec, launcher)  # before the run folder exists: a refused launch leaves nothing behind
    if spec.target.storage:  # the user's own spec: this process may resume it and bring it home (trust.storage_gate)
        storage_named(spec.target.storage)
    run_dir = RunDir.create(root or spec.output_dir, spec)
    vouch.mark(run_dir)  # the user's own spec: its resume is not gated as a stranger's folder (runfolder.vouch)
    run = Run(run_dir.path)
    run._process = _start(run_dir, spec, cwd=None if cwd is None else str(cwd), launcher=launcher)
    return run


def train_spec(
    spec: RunSpec,
    progress: bool = True,
    on_metrics: Callable[[dict], None] | None = None,
    log: Callable[[str], None] = print,
    view: Any = None,
) -> dict[str, Any]:
    """Train `spec` in this process and return its result: `launch(spec, launcher=Foreground(...))` (the preflight,
    model and data included, before the run folder exists, so a refused spec leaves nothing behind; the run folder;
    the start), for a script or a test that trains here and wants the result.

    With a `view` (`ortlab train`'s `Terminal`), ortlab's lines and a progress bar go to the screen and everything
    else this process prints (third-party libraries) to the run's logs/run.log."""
    from ortlab.runner.foreground import Foreground

    launcher = Foreground(view, progress, log, on_metrics)
    launch(spec, launcher=launcher)
    return launcher.result or {}


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
        candidate = run_folder(base, str(run_id))
    except ValueError as e:
        raise RunError(str(e)) from None
    if not _has_status(candidate):
        known = ", ".join(r.id for r in runs(base)) or "none"
        raise RunError(f"no run {str(run_id)!r} (runs under {base}: {known})")
    return Run(candidate)
