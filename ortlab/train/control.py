"""How a run is stopped and paused from outside: its folder's control files (and SIGTERM), agreed by every rank.

`Run.stop` and `Run.pause` write `control/stop` and `control/pause` into the run folder; the training process
checks them at every optimizer step through `stop_callback`. Several processes must leave (or wait) at the same
step, or the next collective operation hangs, so the ranks agree on each check (one all-reduce of two flags).
"""

from __future__ import annotations

import time
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.runfolder.rundir import RunDir


class StoppedBeforeTraining(OrtlabError, RuntimeError):
    """SIGTERM reached the run before its training loop began: there is no step to finish and no checkpoint to
    keep, so the run ends at once (a hanging load or evaluation would otherwise never see the request)."""


class StopRequested:
    """Set by SIGTERM or by the run folder's control/stop file; checked after every optimizer step.

    `training`: the training loop is running, so a SIGTERM waits for the step to end (`on_sigterm`)."""

    def __init__(self, run: RunDir):
        self.run = run
        self.flag = False
        self.training = False

    def on_sigterm(self, *_: Any) -> None:
        """SIGTERM's handler: a graceful stop at the next step inside the training loop; before it (the checks, the
        model load, the evaluation before training), the run ends now, raising StoppedBeforeTraining."""
        self.flag = True
        if not self.training:
            raise StoppedBeforeTraining(
                "stopped (SIGTERM) before training began: nothing was trained and there is no checkpoint to keep; "
                "start the run again"
            )

    def __call__(self) -> bool:
        self.flag = self.flag or self.run.stop_requested()
        return self.flag

    def paused(self, step: int) -> bool:
        return self.run.pause_requested(step) and not self()


def stop_callback(stop: StopRequested) -> Any:
    from transformers import TrainerCallback

    class StopOnRequest(TrainerCallback):
        """A graceful stop: finish the current step, save a checkpoint, leave the training loop."""

        def on_step_begin(self, args, state, control, **kwargs):
            # A pause (control/pause) holds *between* steps: the last step's record is written, and this callback
            # runs before the metrics callback starts the next step's clock, so the wait is not counted as work.
            _, paused = self._agree(args, stop(), stop.paused(state.global_step))
            if not paused:
                return
            if state.is_world_process_zero:
                stop.run.update_status(paused=True, step=state.global_step)
            while paused:
                time.sleep(0.2)
                _, paused = self._agree(args, stop(), stop.paused(state.global_step))
            if state.is_world_process_zero:
                stop.run.update_status(paused=False)

        def on_step_end(self, args, state, control, **kwargs):
            requested, _ = self._agree(args, stop(), False)
            if requested:
                control.should_save = True
                control.should_training_stop = True

        @staticmethod
        def _agree(args, requested: bool, paused: bool) -> tuple[bool, bool]:
            if args.world_size <= 1:
                return requested, paused
            # Every rank must leave (or wait) at the same step, or the next collective op hangs: agree on both.
            import torch
            import torch.distributed as dist

            flags = torch.tensor([float(requested), float(paused)], device=args.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            stop.flag = stop.flag or bool(flags[0].item())
            return bool(flags[0].item()), bool(flags[1].item())

    return StopOnRequest()
