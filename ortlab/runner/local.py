"""Driver side: the local launcher: a run as a process on this machine, in its own session, writing its folder.

Three things vary, and only in the command line and the preflight before it:

    interpreter   this one; ortlab's compile runtime when the mix needs torch >= 2.7 (torch_compile in the ORT
                  runtime); or the one the spec names (`target.python`), checked first by running it
    processes     one: `python -m ortlab.lifecycle RUN` (the run process's entry); several: the same under torchrun
                  (`python -m ortlab.runner.torchrun --nproc_per_node N`: torchrun, its rendezvous store on a
                  socket bound to loopback, since torch's own binds every interface whatever address it is given)

Torchrun and another Python are not launchers of their own: they share every operation but the command line and
the preflight, so a class each would only copy `start` and `terminate`.

The preflight reads the target interpreter's doctor (`launch_doctor`: its cached answers; only a group never
probed in that environment is probed, once, ~10 s in processes of its own, and never the matmul peak, which the run
measures itself), so launching never imports torch into the caller and never waits for a probe that already failed:
the Jupyter server launches in its own process, and `ortlab doctor` and a launch never disagree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ortlab.accel.tcmalloc import process_env
from ortlab.adapters import AdapterError, check_installed
from ortlab.envvars import WITHOUT_HUB_TOKEN, child_cwd, child_env
from ortlab.probe import cached_report, doctor
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir
from ortlab.runner.launcher import Launcher, RunError, mix_problems
from ortlab.runtimes import state_of
from ortlab.trackers import not_installed

# The run log's line when a resumed folder from elsewhere starts without the user's Hub token (`Run.resume`).
HUB_TOKEN_WITHHELD = (
    "(this run folder does not carry your mark: you did not launch it here, or its spec.yaml changed since, so its "
    "Hub downloads go without your Hugging Face token; `ortlab resume RUN --hub-token` sends it)"
)

# How long a named interpreter may take to import torch, transformers and ortlab before it is refused.
PYTHON_CHECK_TIMEOUT_S = 120
WORKER = "ortlab.lifecycle"  # the run process: `python -m ortlab.lifecycle RUN_DIR` (its `__main__`)
TORCHRUN = "ortlab.runner.torchrun"


class Local(Launcher):
    kind = "local"

    def interpreter(self, spec: Any) -> tuple[str, str | None]:
        """(interpreter, ortlab runtime name) that a run of `spec` starts in, without checking it.

        `target.python` when the spec names one; else ortlab's compile runtime when the mix asks for
        torch_compile and this interpreter's doctor sends it there (its torch cannot compile; the runtime can);
        else this interpreter. Raises RunError, with the doctor's reason and remedy (the command that builds the
        runtime), when torch_compile can run in neither.
        """
        if spec.target.python:
            return str(spec.target.python), None
        if not spec.accel.torch_compile or spec.accel.ort is True:
            return sys.executable, None
        # Where torch_compile runs: this runtime's row says, from the compile runtime's doctor (no torch imported here).
        here = launch_doctor(sys.executable, runtimes=True).accelerations["torch_compile"].to_dict()
        details = here.get("details") or {}
        if details.get("runtime") == "compile":
            state = state_of("compile")
            if state.python is None:
                raise RunError(
                    f"this run asks for torch_compile, which runs in ortlab's compile runtime, but {state.why}"
                )
            return str(state.python), "compile"
        if details.get("needs_newer_torch"):
            raise RunError(f"this run asks for torch_compile: {here['reason']}. Fix: {here['remedy']}")
        return sys.executable, None

    def doctor(self, spec: Any) -> dict[str, Any]:
        return doctor(self.interpreter(spec)[0]).to_dict()

    def preflight(self, spec: Any) -> dict[str, Any]:
        """The mix against the doctor of the interpreter the run will use; a named interpreter is first run once
        (is it a Python that imports ortlab's dependencies?). Returns that doctor's report."""
        if spec.target.python:
            check_python(str(spec.target.python))
        python, _ = self.interpreter(spec)  # (the compile runtime, when the mix needs it and it is built)
        report = launch_doctor(python).to_dict()
        problems = mix_problems(spec, report["accelerations"], "this Python" if python == sys.executable else python)
        if python == sys.executable:
            problems += _packages_problems(spec)
        if problems:
            raise RunError("this run cannot start here:\n" + "\n".join(f"  - {p}" for p in problems))
        return report

    def command(self, run: RunDir, spec: Any, resume: bool, base: str | None = None) -> tuple[list[str], str | None]:
        """(command line, runtime) of the run's process. `base`: the caller's folder, where the spec's relative
        paths mean something (the process itself runs in `child_cwd`)."""
        python, runtime = self.interpreter(spec)
        if os.sep in python and not os.path.isabs(python):
            python = os.path.abspath(python)  # as `check_python` found it, from this process's folder
        worker = ["-m", WORKER, str(run.path.resolve()), *(["--resume"] if resume else [])]
        worker += ["--base", os.path.abspath(base or os.getcwd())]
        if spec.target.processes == 1:
            return [python, *worker], runtime
        return [
            python,
            "-m",
            TORCHRUN,  # torchrun, its rendezvous store on loopback only (torch's own binds every interface)
            f"--nproc_per_node={spec.target.processes}",
            *worker,
        ], runtime

    def start(
        self, run: RunDir, spec: Any, resume: bool = False, cwd: str | None = None, hub_token: bool = True
    ) -> subprocess.Popen:
        """Start the worker; status.json records its pid and create time (how a reader tells it is alive), the
        first words of its command, and the ortlab runtime chosen ("current" when it runs where the spec says)."""
        cmd, runtime = self.command(run, spec, resume, base=cwd)
        # Opened without following a link: a planted logs/run.log link would get the run's output appended elsewhere.
        with os.fdopen(run.open_log(), "ab") as log:
            log.write(f"\n$ {' '.join(cmd)}\n".encode())
            if not hub_token:
                log.write(HUB_TOKEN_WITHHELD.encode() + b"\n")
            log.flush()
            try:
                # Its own session: a stop or kill reaches the whole group (torchrun and its workers), and a notebook
                # interrupt (SIGINT to the kernel's group) does not reach the run. Its own folder and a safe path
                # (`child_env`): nothing is imported from the caller's folder (`cwd` reaches it as --base).
                proc = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**allocator_env(spec, cmd[0]), **({} if hub_token else WITHOUT_HUB_TOKEN)},
                    cwd=child_cwd(),
                    start_new_session=True,
                )
            except OSError as e:
                run.set_status("failed", error=f"the run process could not be started: {e} (command: {cmd[0]})", step=0)
                raise RunError(f"run {run.id} could not start: {e}") from None
        run.update_status(
            pid=proc.pid, create_time=process_create_time(proc.pid), launcher=cmd[:3], runtime=runtime or "current"
        )
        return proc

    def terminate(self, run: RunDir, status: dict[str, Any]) -> None:
        """SIGTERM to the worker's process group, SIGKILL 5 s later: only once the recorded pid is shown to be this
        folder's worker (see `is_run_process`)."""
        if not is_run_process(run, status):
            raise RunError(
                f"run {run.id} did not stop when asked, and the process its status.json names (pid "
                f"{status.get('pid')}) is not this run's worker: nothing was signalled. Look at the run's "
                "logs/run.log and end its process yourself"
            )
        _signal_group(status["pid"], signal.SIGTERM)
        time.sleep(5)
        if is_run_process(run, status):
            _signal_group(status["pid"], signal.SIGKILL)


def launch_doctor(python: str, runtimes: bool = False) -> Any:
    """What a launch knows of `python`'s environment: the doctor's cached answers, a group never probed there
    probed once (its progress shown), a failed one not tried again, the matmul peak not measured (issue #42).
    `runtimes`: ortlab's other runtimes probed too when never probed (a torch_compile run goes to one)."""
    return doctor(python, retry=False, peak=False, runtimes=runtimes)


def is_run_process(run: RunDir, status: dict[str, Any]) -> bool:
    """Is the recorded pid still this run's launched worker (same create time, a worker of this very folder,
    leading its own process group), so that signalling its group reaches the run and nothing else?

    A pid from status.json alone is not enough before sending a signal: the process may have ended and the
    pid been reused by anything, or the file may have been edited (see `processes.run_process`).
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
    launched = WORKER in cmdline and str(run.path.resolve()) in cmdline
    return launched and group == pid  # started with start_new_session: the group is the worker's own


def allocator_env(spec: Any, python: str) -> dict[str, str]:
    """The run process's environment (`child_env`), its allocator chosen (`ortlab.accel.tcmalloc`): tcmalloc when
    the spec asks for it, or leaves it to 'auto' and the interpreter's doctor found it working; glibc's otherwise.
    (A spec that asks for it where it is missing was refused by `preflight`, with the doctor's remedy.) The
    doctor's report is the one `preflight` made just before: read from its cache, never probed here."""
    setting = spec.accel.tcmalloc
    if setting == "auto":
        report = cached_report(python)
        found = report.accelerations.get("tcmalloc") if report is not None else None
        setting = found is not None and found.available
    return process_env(child_env(), on=bool(setting))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def check_python(python: str) -> None:
    """A named interpreter must be an executable Python that imports torch, transformers and ortlab, checked in
    seconds, not found out in the run. Only an interpreter the user named reaches this (a run folder's is refused
    before, see `ortlab.runner.trust`)."""
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
            cwd=child_cwd(),
            timeout=PYTHON_CHECK_TIMEOUT_S,
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


def _packages_problems(spec: Any) -> list[str]:
    """What the spec needs from this interpreter besides the accelerations: its trackers, peft for LoRA. (Looked
    up without importing them; another interpreter's packages are its own, and its run says what is missing.)"""
    problems = list(not_installed(spec.report_to))
    if spec.adapter.kind == "lora":
        try:
            check_installed()
        except AdapterError as e:
            problems.append(str(e))
    return problems
