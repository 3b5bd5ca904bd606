"""Driver side: the launcher interface: how a run is started, and ended the hard way, on one kind of target.

    target                                   launcher                    where it lives
    this very process (`ortlab train`)       Foreground                  ortlab/runner/foreground.py
    this machine, one process                Local                       ortlab/runner/local.py
      ... in ortlab's compile runtime        Local (its interpreter)
      ... in another Python (target.python)  Local (its interpreter)
      ... several processes (torchrun)       Local (torchrun's command)
    a Ray cluster (target.cluster)           RayJob                      ortlab/runner/rayjob.py
      ... several processes                  RayTrain (Ray Train workers) ortlab/runner/raytrainjob.py

Every launcher does the same five things, and `ortlab.runner` calls nothing else (`launch` is the preflight, the
run folder, then the start, whichever the launcher):

    doctor(spec)             the target's own doctor report (this interpreter's, a runtime's, a cluster's)
    preflight(spec)          before anything is created: can this spec run there? (the launcher's pre-flight of
                             a spec against its target: the mix against the target's doctor, the interpreter,
                             the cluster's resources; the foreground's adds the model and data checks)
    start(run, spec, ...)    start the worker of a claimed (`pending`) run folder; return the local process it
                             started (the worker, or the monitor that mirrors a remote worker into the folder),
                             or None where the run trained in this process and has ended (the foreground)
    terminate(run, status)   a graceful stop timed out: end what was started, or say why it cannot
    bring_home(run)          the results into the local run folder (nothing to do where the worker writes there)

What every launcher shares is not in a launcher: the run folder. A launcher keeps the local folder current (the
worker writes it, or a monitor mirrors it), so following a run, pausing it and asking it to stop (the control
files, which a monitor forwards) work the same on every target. The launcher is chosen from the spec alone
(`ortlab.runner.launcher_for`), so a resumed run finds its own again; only a caller that waits for the run in
this process (`ortlab train`) asks whether it may train right here (`here=True`), and gets the foreground
launcher when it can (`in_process`: the caller shows the run with a view of its own instead of following its
folder, and passes that launcher to `launch`).
"""

from __future__ import annotations

import subprocess
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.runfolder.rundir import RunDir


class RunError(OrtlabError, RuntimeError):
    """A run operation that cannot be done in the run's current state (the message says why)."""


class Launcher:
    """One kind of target. Subclasses implement the five operations; see the module docstring."""

    #: a word for where runs go ("local", "ray-job", "ray-train"): recorded in the run's status
    kind = "launcher"
    #: the run trains in the caller's own process: `start` returns once it has ended (the foreground launcher)
    in_process = False

    def doctor(self, spec: Any) -> dict[str, Any]:
        """The doctor's report (`DoctorReport.to_dict()` form) of where `spec` would run, judging nothing."""
        raise NotImplementedError

    def preflight(self, spec: Any) -> dict[str, Any] | None:
        """The pre-flight of `spec` against this target, before anything is created: raise RunError naming every
        reason it cannot run there; may return a doctor report."""
        raise NotImplementedError

    def start(
        self, run: RunDir, spec: Any, resume: bool = False, cwd: str | None = None, hub_token: bool = True
    ) -> subprocess.Popen | None:
        """Start the worker of a claimed run folder. A start that fails ends the run `failed` and raises RunError.
        `cwd`: where relative paths in the spec mean something (default: this process's folder). None: the run
        trained in this process and has ended (the foreground launcher). `hub_token=False`: the run's Hub downloads go
        without the user's Hugging Face token (a resumed folder from elsewhere: `Run.resume`)."""
        raise NotImplementedError

    def terminate(self, run: RunDir, status: dict[str, Any]) -> None:
        """End a run that did not stop when asked, or raise RunError saying what the user must do instead."""
        raise NotImplementedError

    def bring_home(self, run: RunDir) -> None:
        """Copy what the run made elsewhere (model, result, last checkpoint) into the local run folder."""


def mix_problems(spec: Any, accelerations: dict[str, dict[str, Any]], where: str) -> list[str]:
    """One line per acceleration the spec asks for explicitly that a doctor's report (`to_dict()` form, so a
    report from another machine works too) says is not available `where`."""
    wanted = spec.asked_mix().requested()  # ('auto' resolves in the target runtime itself, when the run starts)
    unknown = {"reason": "its doctor does not know this acceleration", "remedy": "install the same ortlab there"}
    found = {name: accelerations.get(name) or unknown for name in wanted}
    return [
        f"accel: {name} is not available in {where}: {found[name]['reason']}. Fix: {found[name]['remedy']}"
        for name, on in wanted.items()
        if on and not found[name].get("available", False)
    ]
