"""Driver side: the foreground launcher: a run trained in this very process, followed by a view beside it.

`ortlab train` trains in the terminal's own process when it can (this interpreter, one process, not detached:
`ortlab.runner.launcher_for(spec, here=True)` decides): no second interpreter to start, every line of progress
straight on the screen, and Ctrl-C reaches the training itself (the run ends `failed`, its folder keeping what was
written, and the command says so). Anything else is launched and followed through its run folder. Either way the
run is started by one call, `ortlab.runner.launch(spec, launcher=...)`: the command passes this launcher, with its
view, and never asks for a launcher's class.

It does what every launcher does, in this process:

    preflight  the pre-flight where the run trains, so here: the mix against this process (`accel.mix.validate`,
               each broken rule with its fix), the trackers it reports to; then the model and data checks
               (`ortlab.fit.check_model_and_data`), kept for the start so the data is loaded once: the run's one
               input check
    start      trains the run (`ortlab.lifecycle.execute`) and returns when it has ended: there is no process to
               return; `result` holds what it made. The view, when there is one (`ortlab.train.terminal.Terminal`),
               follows the run from the start: the run's log takes the captured output, the view every record
    terminate  nothing to end from outside: the process is the user's terminal (a stop request still works, as
               for every run: `control/stop`)

`ortlab.runner.train_spec` is `launch` with this launcher, for a script or a test that trains here and wants the
result.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ortlab import fit
from ortlab.accel.mix import MixError, mix_of, runtime_for, validate
from ortlab.lifecycle.execute import execute
from ortlab.probe import doctor
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir
from ortlab.runner.launcher import Launcher, RunError
from ortlab.spec import SpecError
from ortlab.trackers import not_installed


class Foreground(Launcher):
    kind = "foreground"
    in_process = True

    def __init__(
        self,
        view: Any = None,
        progress: bool = True,
        log: Callable[[str], None] = print,
        on_metrics: Callable[[dict], None] | None = None,
    ):
        self.view = view
        self.progress = progress
        # A view's lines carry names and paths from the spec: never read as rich markup.
        self.log = view.plain if view is not None else log
        self.on_metrics = on_metrics
        self.checked: tuple | None = None
        self.result: dict[str, Any] | None = None

    def doctor(self, spec: Any) -> dict[str, Any]:
        return doctor().to_dict()

    def preflight(self, spec: Any) -> None:
        """This process is the target: its mix is checked here (MixError names each broken rule with its fix; a
        launched run is checked against its target's doctor instead), then the data and the model, once: the start
        trains on what this check loaded (`execute(checked=...)`), and a launched run's process checks its own."""
        mix = mix_of(spec)
        if runtime_for(mix) is not None:
            raise MixError(
                [
                    "torch_compile cannot run in this process (its torch cannot compile): launch the run "
                    "(ortlab.launch(spec), `ortlab train`) and it goes to ortlab's compile runtime"
                ]
            )
        validate(mix)
        missing = not_installed(spec.report_to)
        if missing:
            raise SpecError(missing)
        if self.view is not None:
            self.log(f"checking the model ({spec.model.name}) and the data ({spec.data.source}) ...")
        self.checked = fit.check_model_and_data(spec, self.log)

    def start(
        self, run: RunDir, spec: Any, resume: bool = False, cwd: str | None = None, hub_token: bool = True
    ) -> None:
        """Train `run` here until it ends; `self.result` is its result. (`cwd` cannot apply: relative paths in
        the spec are this process's own.)"""

        if self.view is not None:
            self.view.log_to(run.log_path)
        pid = os.getpid()  # (a resumed run was claimed `pending` by `Run.resume`: the same state, this process)
        run.set_status("pending", pid=pid, create_time=process_create_time(pid))
        self.result = execute(
            run,
            resume=resume,
            checked=self.checked,
            progress=self.progress,
            on_metrics=self.on_metrics,
            log=self.log,
            view=self.view,
        )

    def terminate(self, run: RunDir, status: dict[str, Any]) -> None:
        raise RunError(
            f"run {run.id} trains in the foreground of the terminal that started it: press Ctrl-C there, or end "
            f"that process (pid {status.get('pid')})"
        )
