"""The run side of `budget.minutes`: training ends in time for the evaluation and the save after it.

The launch fitted `hyper.max_steps` to the budget from the estimate; this is what keeps the promise when the run
goes slower than predicted (a busy machine, a wrong efficiency). The reserve for what follows training is measured,
not guessed: the evaluation before training took as long as the one after will (the same rows), plus a margin for
saving the model. A run that ends early this way still completes: evaluated, saved, with `ended_early_at_step` in
its result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SAVE_BASE_S = 1.0  # the tokenizer, the config, result.json
SAVE_BYTES_PER_S = 300e6  # safetensors to a local disk (a 135M model's 540 MB took about 2 s here)
EVAL_MARGIN = 1.1  # the evaluation after training, against the one before: the same rows, a warmer process


def reserve_s(eval_before_s: float | None, minutes: float, save_bytes: float = 0.0) -> float:
    """Seconds to keep for the evaluation and the save after training: the evaluation before, measured (the one
    after repeats it on the same rows), and the save by the size of what is saved (`save_bytes`: the weights, or a
    LoRA adapter's); for a resumed run (no evaluation before in this process), a tenth of the budget.

    Why not more margin: every second kept is a second of the budget not trained (bench_budget: a 5 s save margin
    and 25 % on the evaluation ended 30-second MiniLM runs at 0.81-0.84 of their budget)."""
    if eval_before_s is None:
        return 0.1 * minutes * 60
    return EVAL_MARGIN * eval_before_s + SAVE_BASE_S + save_bytes / SAVE_BYTES_PER_S


class BudgetClock:
    """Ends training at the first step that ends after `stop_at` (time.monotonic seconds). `callback()` is it as a
    transformers TrainerCallback (transformers is imported there, not when this module is)."""

    def __init__(self, stop_at: float, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.stop_at, self.log, self.clock = stop_at, log, clock
        self.ended_at_step: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.ended_at_step is None and self.clock() >= self.stop_at and state.global_step < state.max_steps:
            self.ended_at_step = state.global_step
            control.should_training_stop = True
            self.log(
                f"the budget's time is up at step {state.global_step} of {state.max_steps}: training ends here, "
                "then the evaluation and the save"
            )
        return control

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Budget(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                return clock.on_step_end(args, state, control)

        return Budget()
