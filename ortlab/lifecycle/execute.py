"""A run's lifecycle in its process: start (or resume), stop when asked, finish and save, inside its run folder.

`execute` is what every run process does, whoever launched it (a worker `python -m ortlab.lifecycle`, a Ray
job, a Ray Train rank, `ortlab train` in the foreground). The run folder's `status.json` says at every moment
what state the run is in, and `completed` only once the model and `result.json` are written. The order inside:
the model and data checks (skipped when the launcher ran them already), assembly (`ortlab.lifecycle.assemble`),
what the accelerations left at 'auto' become (decided here, maybe measured: `ortlab.tune.auto`; a resumed run
keeps its first decision), the evaluation before training (or the resume record), the training, then either the
stop (a checkpoint) or the evaluation after and the saved model.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortlab import safeio
from ortlab.accel.mix import resolve
from ortlab.adapters import adapter_summary, merge
from ortlab.data import DataError
from ortlab.data.load import read_error
from ortlab.estimator.checked import after_run, before_run
from ortlab.fit import check_model_and_data
from ortlab.lifecycle.assemble import Loaded, build_trainer, load_model_and_data
from ortlab.runfolder import events
from ortlab.runfolder.compare import summarize
from ortlab.runfolder.rundir import RunDir, checkpoint_step
from ortlab.runfolder.stream import summary_of
from ortlab.scores import add_perplexity
from ortlab.spec import RunSpec
from ortlab.trackers import finish, offline
from ortlab.train.control import StopRequested, stop_callback
from ortlab.tune.auto import decide
from ortlab.tune.result import TuneResult


@dataclass
class Watchers:
    """What watches a run from inside its process: ortlab's lines (`log`), transformers' progress bars
    (`progress`), a view that follows the run here (`view`: the terminal's, in `ortlab train`; it gets every
    metrics record and draws its own bars), a sink for each metrics record, and a launcher's own callbacks."""

    log: Callable[[str], None] = print
    progress: bool = True
    on_metrics: Callable[[dict], None] | None = None
    view: Any = None
    callbacks: Sequence[Any] = field(default_factory=tuple)

    def sink(self) -> Callable[[dict], None] | None:
        """Where each metrics record goes as it is written, besides the run folder: the view, then `on_metrics`."""
        if self.view is None:
            return self.on_metrics
        sinks = [s for s in (self.view.on_record, self.on_metrics) if s is not None]

        def both(record: dict) -> None:
            for sink in sinks:
                sink(record)

        return both

    def trainer_callbacks(self, stop: StopRequested) -> list[Any]:
        return [stop_callback(stop), *([self.view.callback()] if self.view is not None else []), *self.callbacks]

    def bars(self) -> bool:
        """transformers' own progress bars: only where no view draws its own (or it shows everything)."""
        return self.progress and (self.view is None or self.view.verbose)


def execute(
    run: RunDir,
    resume: bool = False,
    checked: tuple | None = None,
    progress: bool = True,
    on_metrics: Callable[[dict], None] | None = None,
    log: Callable[[str], None] = print,
    view: Any = None,
    callbacks: Sequence[Any] = (),
    base: str | None = None,
) -> dict[str, Any]:
    """Train the run in `run` (resuming from its last checkpoint if asked); keep its status true throughout.

    `checked`: the model and data checks' answer (`fit.check_model_and_data`) when the launcher ran them in this
    process already.
    `view`: what follows the run here (`ortlab.train.terminal.Terminal`). `callbacks`: more `TrainerCallback`s, for
    a launcher that must act at a point of training (a Ray Train worker uploads each checkpoint to an object store
    once every rank has written its part). `base`: the folder the spec's relative paths were written in, when this
    process runs elsewhere (a launched worker runs in `ortlab.envvars.child_cwd`)."""
    # The run's log stays open while this process runs it, until its final status is written: how readers tell
    # this process (a notebook kernel too) from one that a forged status.json names (`processes.run_process`).
    try:
        held: int | None = run.open_log()
    except OSError:
        held = None  # a planted link at logs/run.log: readers will call this run damaged, which it is
    try:
        return _execute(run, resume, checked, Watchers(log, progress, on_metrics, view, callbacks), base)
    finally:
        if held is not None:
            os.close(held)


def _execute(
    run: RunDir, resume: bool, checked: tuple | None, watch: Watchers, base: str | None = None
) -> dict[str, Any]:
    started = time.monotonic()
    stop = StopRequested(run)
    previous = signal.getsignal(signal.SIGTERM)
    if _is_main_thread():
        signal.signal(signal.SIGTERM, stop.on_sigterm)
    rank = int(os.environ.get("RANK", "0"))
    try:
        spec = RunSpec.from_run(run)
        spec = spec if base is None else spec.anchored(base)
        if rank == 0:
            run.set_status(
                "running",
                started=time.time(),
                worker_pid=os.getpid(),
                python=sys.executable,
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                step=run.last_step(),
            )
        predicted = before_run(spec) if rank == 0 else None  # from the spec alone, before the model loads
        model_path, prepared = checked or check_model_and_data(spec, watch.log)
        minutes = spec.budget.minutes
        deadline = started + 60 * minutes if minutes else None  # the same clock as the result's wall_time_s
        with offline(spec.report_to, run.path):
            result = _train(spec, run, model_path, prepared, resume, stop, watch, deadline)
        ended = result.pop("_ended", None)
    except BaseException as e:
        if rank == 0:
            run.set_status(
                "failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), step=run.last_step()
            )
        raise
    finally:
        if _is_main_thread():
            signal.signal(signal.SIGTERM, previous)
    if rank == 0:
        if result.get("stopped"):
            run.set_status("stopped", step=result["step"], checkpoint=result["checkpoint"])
        else:
            result["wall_time_s"] = time.monotonic() - started
            world = int(os.environ.get("WORLD_SIZE", "1"))
            result["estimate"] = after_run(predicted, spec, result, world)  # predicted against measured
            if spec.budget.asked:
                result["budget"] = {**spec.budget.model_dump(mode="json"), "ended_early_at_step": ended}
            safeio.write_json(run.path, run.result_path.name, result)
            run.set_status("completed", step=result["summary"]["steps"])
    return result


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _train(
    spec: RunSpec,
    run: RunDir,
    model_path: str,
    prepared: Any,
    resume: bool,
    stop: StopRequested,
    watch: Watchers,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Assemble, decide the mix, then evaluate, train, and stop or finish. `deadline`: when `budget.minutes` are up
    (time.monotonic seconds), which training ends in time for."""
    log = watch.log
    for line in spec.budget.fitted:
        log(f"fitted to the budget: {line}")
    loaded = load_model_and_data(spec, model_path, prepared, log)
    # A resumed run keeps the mix it started with; a new one decides what 'auto' means here (maybe measuring).
    choice = _stored_choice(run) if resume else _auto_mix(loaded, run, model_path, log)
    choice = _yield_to_packing(loaded, choice, log)
    trainer = build_trainer(loaded, run, choice, watch.bars(), watch.sink(), watch.trainer_callbacks(stop), log)
    spec = loaded.spec
    score = add_perplexity if spec.task_record.perplexity else dict
    emit = trainer.metrics_sink if trainer.is_world_process_zero() else (lambda record: None)
    checkpoint = run.last_checkpoint() if resume else None
    if resume and checkpoint is None:
        raise RuntimeError(f"cannot resume {run.id}: it has no complete checkpoint in {run.checkpoints}")
    if loaded.prepared.chat and len(loaded.eval_ds) == 0:  # (`fit.check_answers` says so from the first rows)
        raise DataError(
            "data: no eval conversation keeps an assistant token within hyper.max_length (every answer is cut off), "
            "so there is nothing to evaluate on; raise hyper.max_length or shorten the prompts"
        )
    if checkpoint is None:
        trainer.eval_phase = "before"  # the metrics callback writes the eval record, tagged with its phase
        log(f"evaluating on {len(loaded.eval_ds)} rows before training ...")
        before = score(trainer.evaluate(metric_key_prefix="eval"))
        log("before training: " + _headline(before))
    else:
        before = summary_of(run.path).eval_before or {}
        emit({"event": events.RESUME, "step": checkpoint_step(checkpoint.name), "checkpoint": str(checkpoint)})
        log(f"resuming from {checkpoint}")
    trainer.eval_phase = None
    clock = None
    # One process only: in a run of several, each rank's clock could end training at another step (a collective
    # would then wait forever); there the fitted max_steps alone holds the budget.
    if deadline is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        from ortlab.lifecycle.budgetclock import BudgetClock, reserve_s

        saved = [p for p in trainer.model.parameters() if p.requires_grad or spec.adapter.kind != "lora"]
        save_bytes = sum(p.numel() * p.element_size() for p in saved)
        eval_s = before.get("eval_runtime") if checkpoint is None else None  # (transformers' timing of it)
        clock = BudgetClock(deadline - reserve_s(eval_s, spec.budget.minutes, save_bytes), log)
        trainer.add_callback(clock.callback())
    stop.training = True  # from here a SIGTERM stops at the end of a step, keeping a checkpoint
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except Exception as e:  # a streamed CSV's line that does not parse, read only now: said with its line
        late = read_error(e, spec.data.source)
        if late is None:
            raise
        raise late from e
    finally:
        stop.training = False
    if stop.flag:
        last = run.last_checkpoint()
        emit({"event": events.STOPPED, "step": trainer.state.global_step, "checkpoint": str(last)})
        trainer.metrics_sink.close()
        log(f"stopped at step {trainer.state.global_step}; checkpoint {last}")
        return {"stopped": True, "step": trainer.state.global_step, "checkpoint": str(last), "run_dir": str(run.path)}
    return {**_finish(trainer, loaded, run, before, score, log), "_ended": clock and clock.ended_at_step}


def _finish(
    trainer: Any, loaded: Loaded, run: RunDir, before: dict, score: Callable, log: Callable[[str], None]
) -> dict[str, Any]:
    """The evaluation after training, the trackers closed, the model (and a merged copy) saved: the result."""
    spec = loaded.spec
    trainer.eval_phase = "after"
    log(f"evaluating on {len(loaded.eval_ds)} rows after training ...")
    after = score(trainer.evaluate(metric_key_prefix="eval"))
    trainer.metrics_sink.close()
    if spec.report_to:
        finish(trainer.callback_handler.callbacks)
    log("after training:  " + _headline(after))
    if hasattr(trainer, "preference_record"):
        sharing = trainer.prompt_sharing
        why = f" ({sharing['reason']})" if sharing["reason"] else ""
        log(f"pairs: reference {trainer.reference}; each prompt run once: {sharing['applied']}{why}")
    log(f"saving the {'adapter' if spec.adapter.kind == 'lora' else 'model'} to {run.model_dir}")
    trainer.save_model(str(run.model_dir))
    adapter = _adapter_record(trainer.model, spec)  # before a merge folds the adapter away
    if trainer.is_world_process_zero():
        loaded.tokenizer.save_pretrained(str(run.model_dir))
        if spec.adapter.kind == "lora" and spec.adapter.save_merged:
            _save_merged(trainer, loaded.tokenizer, run, log)
    return {
        "run_dir": str(run.path),
        "task": spec.task,
        "model": spec.model.name,
        "data": spec.data.source,
        "label_names": loaded.prepared.label_names,
        "eval_before": before,
        "eval_after": after,
        # Throughput over the whole run, resumed parts included (each part has its own warm-up).
        "summary": summarize(run.records(), trainer.args.metrics_warmup_steps),
        "accelerations": {k: v.to_dict() for k, v in trainer.accelerations.items()},
        "parameters": trainer.parameters_record,
        "adapter": adapter,
        # A preference run: which reference scored the pairs, and whether each prompt ran once (and if not, why).
        **({"preference": trainer.preference_record()} if hasattr(trainer, "preference_record") else {}),
    }


def _auto_mix(loaded: Loaded, run: RunDir, model_path: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Decide the accelerations left at 'auto' (measuring them here if accel.tune says so, else probing the
    precision on the run's own model) and record why.

    The decision goes to the metrics stream (an `auto` record, with the precision probe's timings when it ran) and,
    with the measured table, to tune.json in the run folder, so a run always says why ORT or bf16 was on or off.
    """
    from ortlab.train.metricswriter import JsonLinesSink  # (imports torch)

    spec, prepared = loaded.spec, loaded.prepared
    rank0 = int(os.environ.get("RANK", "0")) == 0
    # (a stream's measuring batches are its head: the first batches the run trains on, `tune.batches_from`)
    choice, result, why = decide(
        spec,
        model_path=model_path,
        label_names=prepared.label_names,
        train_dataset=_lookup_rows(loaded),
        collate=loaded.collate,
        progress=log,
        log_dir=run.path / "logs",
        model=loaded.model,
    )
    resolved = resolve(spec.accel, choice)
    auto = {f: getattr(resolved, f) for f in spec.accel.auto_fields()}
    if rank0:
        tuned = isinstance(result, TuneResult)
        if tuned:
            safeio.write_json(run.path, "tune.json", result.to_dict())
        sink = JsonLinesSink(run.metrics_path)
        record = {"event": events.AUTO, "resolved": auto, "why": why, "tuned": tuned, "choice": choice}
        if tuned:
            record["table"] = result.table()
        elif result is not None:
            record["precision_probe"] = result.to_dict()
        sink(record)
        sink.close()
    if auto:
        log("auto accelerations: " + ", ".join(f"{k}={v}" for k, v in auto.items()) + f" ({why})")
    return choice


def _lookup_rows(loaded: Loaded) -> Any:
    """The rows the acceleration lookup draws batches from: the training split, or for causal-lm data prepared as
    read (no length, no shuffled access) its first prepared rows, enough for the lookup's batches."""
    spec = loaded.spec
    if not (loaded.prepared.lazy and spec.task_record.blocks):
        return loaded.train_ds
    if not spec.accel.auto_fields() or spec.accel.tune == "off" or spec.target.processes > 1:
        return None  # `decide` reads no rows then: none are prepared for it
    from ortlab.data.lazylm import lookup_sample
    from ortlab.tune.auto import BATCHES

    return lookup_sample(loaded.train_ds, BATCHES * spec.hyper.batch_size, loaded.prepared)


def _yield_to_packing(loaded: Loaded, choice: dict[str, Any] | None, log: Callable[[str], None]) -> Any:
    """Packed rows carry no attention_mask (the examples' bounds are in position_ids), and ORTModule's export of
    decoder models needs an explicit one: 'auto' yields to packing, and says so (a resumed run again: its stored
    choice is the decision before this)."""
    if loaded.prepared.packing and (choice or {}).get("ort") and loaded.spec.accel.ort == "auto":
        choice = {**choice, "ort": False}
        log("auto accelerations: ort=False (packing passes example bounds as position_ids, which ORT cannot export)")
    return choice


def _stored_choice(run: RunDir) -> dict[str, Any] | None:
    """A resumed run trains with the mix it started with (its `auto` record), not a new decision."""
    for record in run.records():
        if record.get("event") == events.AUTO:
            return record.get("choice")
    return None


def _adapter_record(model: Any, spec: RunSpec) -> dict[str, Any] | None:
    summary = adapter_summary(model)
    if summary is not None:
        summary.update(base_model=spec.model.name, merged=spec.adapter.save_merged)
    return summary


def _save_merged(trainer: Any, tokenizer: Any, run: RunDir, log: Callable[[str], None]) -> None:
    """model/merged/: the base model with the adapter folded in, a plain transformers folder (no peft needed).
    Last thing the run does: merging changes the trained model in place."""
    merged_dir = run.model_dir / "merged"
    log(f"saving the merged model to {merged_dir}")
    merged = merge(trainer.model)
    config = getattr(merged, "config", None)
    if config is not None and trainer._user_use_cache is not None:
        config.use_cache = trainer._user_use_cache
    merged.save_pretrained(str(merged_dir))
    tokenizer.save_pretrained(str(merged_dir))


def _headline(metrics: dict[str, float]) -> str:
    keys = ("eval_accuracy", "eval_f1", "eval_exact_match", "eval_token_f1", "eval_token_accuracy")
    keys += ("eval_perplexity", "eval_rewards/accuracies", "eval_rewards/margins", "eval_loss")
    return ", ".join(f"{k[5:]} {metrics[k]:.4f}" for k in keys if k in metrics)
