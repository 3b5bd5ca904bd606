"""One candidate's own process: the real trainer (`ORTTrainer`), held between steps and timing each slice.

`python -m ortlab.tune CONFIG` runs `_candidate_main`. It speaks a line protocol on stdin/stdout
(`ORTLAB-TUNE {json}` lines; any other output is library noise): `loaded`, then a `run` command is answered by
`ready` (the warm-up) or `slice` (step times, losses, samples), `stop` by `done` (peak memory); a failure is an
`error` line the driver records as the candidate's verdict. `slice_callback` is the timing part, which the
benchmarks reuse with their own trainers. torch and transformers are imported only here, inside the functions.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab.tasks import TASK_FEATURES, load_model
from ortlab.toggles import mix_arguments
from ortlab.tune.mixes import MixCandidate

MARK = "ORTLAB-TUNE "


def _say(msg: dict) -> None:
    sys.stdout.write(MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _candidate_main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    c = MixCandidate(**config["candidate"])
    try:
        trainer = _candidate_trainer(config, c)
        trainer.train()
        return 0
    except Exception as e:  # reported to the driver, which records it as this candidate's verdict
        traceback.print_exc()
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        _say({"event": "error", "error": f"{type(e).__name__}: {text}"[:400]})
        return 1


def _candidate_trainer(config: dict, c: MixCandidate) -> Any:
    import torch
    from transformers import set_seed

    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.trainer import ORTTrainer

    batches = torch.load(config["batches"], weights_only=True)
    set_seed(config["seed"])
    model = load_model(config["model_path"], config["task"], config["label_names"], config["revision"])

    class Cycle(torch.utils.data.Dataset):
        """Each item is a whole collated batch of the run's data, in the same order for every candidate."""

        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict:
            return batches[i % len(batches)]

    settings = dict(
        output_dir=config["out"],
        # (the reference trainer's precision; ORTTrainer's comes with the rest of its mix, below)
        fp16=c.precision == "fp16",
        bf16=c.precision == "bf16",
        learning_rate=config["learning_rate"],
        weight_decay=config["weight_decay"],
        lr_scheduler_type="constant",
        per_device_train_batch_size=1,
        max_steps=10**6,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        seed=config["seed"],
        data_seed=config["seed"],
    )
    warmup = int(config["warmup"])  # the driver's first run command is the warm-up
    if c.reference:  # plain transformers.Trainer, as a user runs it (ortlab.tune.share)
        return _reference_trainer(settings, model, Cycle(), warmup)
    # The candidate's mix, by each toggle's own mapping (`ortlab.toggles`): the fields it names, and no others.
    args = ORTTrainingArguments(**{**settings, **mix_arguments(c.choice())}, ort_log_level="ERROR")
    trainer = ORTTrainer(
        model=model,
        args=args,
        train_dataset=Cycle(),
        data_collator=lambda items: items[0],
        feature=TASK_FEATURES[config["task"]],
    )
    cuda = args.device.type == "cuda"

    def applied() -> tuple[dict[str, bool], str | None]:
        records = [v for v in trainer.accelerations.values() if v.requested]
        why = next(
            (
                str(v.details.get("fallback_reason") or v.details.get("active_precision") or "")[:300]
                for v in records
                if not v.applied
            ),
            None,
        )
        return {v.name: v.applied for v in records}, why

    def step() -> tuple[float, int]:
        return trainer._step_counters["loss"], trainer._step_counters["samples"]

    trainer.add_callback(slice_callback(cuda, warmup, step, applied))
    return trainer


def _reference_trainer(settings: dict, model: Any, dataset: Any, warmup: int) -> Any:
    """Plain `transformers.Trainer` (torch's AdamW, its own loop) on the same batches, timed the same way; it
    records each step's loss and samples as ORTTrainer does, for the slices."""
    import torch
    from transformers import Trainer, TrainingArguments

    class Plain(Trainer):
        last: tuple[float, int] = (float("nan"), 0)

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.last = (float(loss), int(inputs["input_ids"].shape[0]))
            return loss

    # use_cpu: transformers refuses bf16 without a GPU unless told the CPU is meant (ORTTrainingArguments says so).
    args = TrainingArguments(optim="adamw_torch", use_cpu=not torch.cuda.is_available(), **settings)
    trainer = Plain(model=model, args=args, train_dataset=dataset, data_collator=lambda items: items[0])
    trainer.add_callback(slice_callback(args.device.type == "cuda", warmup, lambda: trainer.last))
    return trainer


def slice_callback(
    cuda: bool,
    warmup: int,
    step: Callable[[], tuple[float, int]],
    applied: Callable[[], tuple[dict[str, bool], str | None]] = lambda: ({}, None),
) -> Any:
    """A TrainerCallback that trains only when told (on stdin) and reports each slice of steps (on stdout).

    `step()` gives the finished step's (loss, samples); `applied()` what really applied after the warm-up.
    """
    import torch
    from transformers import TrainerCallback

    from ortlab.train.metricswriter import peak_memory_mb

    class Slices(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.losses: list[float] = []
            self.samples = 0
            self.left = 0

        def on_train_begin(self, args, state, control, **kwargs):
            _say({"event": "loaded"})
            self._wait(args, control)

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)
            loss, samples = step()
            self.losses.append(loss)
            self.samples += samples
            self.left -= 1
            if self.left > 0:
                return
            if state.global_step == warmup:
                done, why = applied()
                _say(
                    {
                        "event": "ready",
                        "warmup_s": sum(self.times),
                        "step_s": self.times[-1],
                        "applied": done,
                        "why": why,
                    }
                )
            else:
                _say({"event": "slice", "times": self.times, "losses": self.losses, "samples": self.samples})
            self.times, self.losses, self.samples = [], [], 0
            self._wait(args, control)

        def _wait(self, args, control) -> None:
            command = json.loads(sys.stdin.readline() or '{"stop": true}')
            if command.get("stop"):
                mem, kind = peak_memory_mb(args.device.type)
                _say({"event": "done", "peak_mem_mb": mem, "mem_kind": kind})
                control.should_training_stop = True
                self.left = 10**9
            else:
                self.left = int(command["run"])

    return Slices()
