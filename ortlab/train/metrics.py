"""Per-step metrics as JSON lines: the one stream every view of a run (widgets, CLI, sidebar) follows.

One line per event, appended and flushed at once, so a reader tailing the file sees each step as it ends and
a killed process leaves only whole lines behind (the last one at worst cut short, which readers skip).

    {"event": "train_begin", "time": ..., "accelerations": {...requested...}, ...}
    {"event": "step", "step": 7, "loss": 0.61, "learning_rate": 4e-05, "step_time_s": 0.41,
     "samples_per_s": 78.1, "tokens_per_s": 9996.0, "peak_mem_mb": 812.3, "epoch": 0.22, "time": ...}
    {"event": "eval", "step": 50, "eval_loss": 0.42, "eval_accuracy": 0.81, ...}
    {"event": "log", ...}            the Trainer's own log line (smoothed loss, grad_norm, ...)
    {"event": "verified", "step": 1, "accelerations": {...what applied, checked after the first step...}}
    {"event": "acceleration", "name": "ort", "requested": true, "applied": false, "details": {...}}
    {"event": "train_end", "summary": {...}, "accelerations": {...}}
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from transformers import TrainerCallback


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than producing lines other readers reject."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonLinesSink:
    """Append-only JSON-lines writer; `None` path writes nothing (but still calls `also`)."""

    def __init__(self, path: str | os.PathLike | None, also: Callable[[dict], None] | None = None):
        self.path = Path(path) if path else None
        self.also = also
        self._file: IO[str] | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        record.setdefault("time", time.time())
        if self.path is not None:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
                if not _ends_with_newline(self.path):
                    # A writer killed mid-line (then a resume): end the torn line, or it would swallow this record.
                    self._file.write("\n")
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()
        if self.also is not None:
            self.also(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def peak_memory_mb(device_type: str) -> tuple[float, str]:
    """Peak memory so far: CUDA allocator peak on GPU, process peak RSS on CPU (what the OS had to give)."""
    if device_type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_peak_rss"


class StepMetricsCallback(TrainerCallback):
    """Times each optimizer step and writes one `step` line per step (rank 0 only).

    The trainer counts samples, tokens and the loss of the micro-batches in `training_step`; the time runs from
    `on_step_begin` to `on_step_end` (forward, backward, optimizer), so batch fetching and evaluation are out.
    """

    def __init__(self, trainer: Any, sink: Callable[[dict], None]):
        self.trainer = trainer
        self.sink = sink
        self.steps: list[dict[str, Any]] = []
        self._t0 = 0.0
        self._lr: float | None = None
        self._train_start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_start = time.perf_counter()
        if state.is_world_process_zero:
            self.sink(
                {
                    "event": "train_begin",
                    "max_steps": state.max_steps,
                    "world_size": args.world_size,
                    "accelerations": {k: v.to_dict() for k, v in self.trainer.accelerations.items()},
                }
            )

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer._reset_step_counters()
        self._t0 = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._lr = self.trainer._get_learning_rate()

    def on_step_end(self, args, state, control, **kwargs):
        dt = time.perf_counter() - self._t0
        self.trainer._after_first_steps(state.global_step)
        counters = self.trainer._step_counters
        world = max(1, args.world_size)
        samples, tokens = counters["samples"] * world, counters["tokens"] * world
        mem, mem_kind = peak_memory_mb(args.device.type)
        record = {
            "event": "step",
            "step": state.global_step,
            "epoch": state.epoch,
            "loss": counters["loss"],
            "learning_rate": self._lr,
            "step_time_s": dt,
            "samples": samples,
            "tokens": tokens,
            "samples_per_s": samples / dt if dt > 0 else None,
            "tokens_per_s": tokens / dt if dt > 0 else None,
            "peak_mem_mb": mem,
            "mem_kind": mem_kind,
        }
        self.steps.append(record)
        if state.is_world_process_zero:
            self.sink(record)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if any(k.startswith("eval_") for k in logs):
            # The one place evaluations are written: `trainer.eval_phase` ("before"/"after", set by whoever
            # evaluates around training) or "during" for evaluations inside the training loop.
            phase = getattr(self.trainer, "eval_phase", None) or "during"
            if "eval_loss" in logs and getattr(self.trainer, "feature", None) == "causal-lm":
                from ortlab.scores import add_perplexity

                logs = add_perplexity(dict(logs))
            self.sink({"event": "eval", "phase": phase, "step": state.global_step, **logs})
        else:
            self.sink({"event": "log", "step": state.global_step, **logs})

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer._after_first_steps(state.global_step, final=True)
        if state.is_world_process_zero:
            self.sink(
                {
                    "event": "train_end",
                    "step": state.global_step,
                    "summary": self.summary(args.metrics_warmup_steps),
                    "accelerations": {k: v.to_dict() for k, v in self.trainer.accelerations.items()},
                }
            )

    def summary(self, warmup_steps: int) -> dict[str, Any]:
        """Warm-up (ORT export and graph build land in the first steps) apart from steady-state throughput."""
        from ortlab.runner.compare import summarize

        return {**summarize(self.steps, warmup_steps), "train_time_s": time.perf_counter() - self._train_start}
