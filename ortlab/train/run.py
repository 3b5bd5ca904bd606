"""Run a `RunSpec`: check, load, tokenize, evaluate, train, evaluate, save, inside a run directory.

The order matters: everything that can fail cheaply (the spec, the model's location, the data and its columns)
is checked before the run folder exists and before a model is loaded, so bad input fails in seconds and leaves
nothing behind that looks like a run. `execute` is what a run process does (in the foreground for
`ortlab train`, or as the launched process of `ortlab.launch`); the run folder's `status.json` says at every
moment what state the run is in, and `completed` only once the model and `result.json` are written.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.accel.mix import mix_of, resolve
from ortlab.fit import check, fitted
from ortlab.runfolder import events
from ortlab.runfolder.rundir import RunDir, process_create_time, write_json
from ortlab.spec import RunSpec, SpecError
from ortlab.train.control import StopRequested, stop_callback
from ortlab.tune.auto import decide

if TYPE_CHECKING:
    from ortlab.train.terminal import Terminal


def training_arguments(spec: RunSpec, run: RunDir, progress: bool, choice: dict[str, Any] | None = None):
    """TrainingArguments for `spec`; the accelerations left at 'auto' take `choice` (a measurement) if given."""
    from ortlab.trackers import run_config
    from ortlab.train.args import ORTTrainingArguments

    a, h = resolve(spec.accel, choice), spec.hyper
    arguments_class, extra = ORTTrainingArguments, {}
    if spec.task == "seq2seq":
        from ortlab.train.seq2seq import ORTSeq2SeqTrainingArguments

        g = spec.generation
        arguments_class = ORTSeq2SeqTrainingArguments
        extra = {
            "predict_with_generate": g.predict_with_generate,
            "generation_max_length": g.max_length or h.max_target_length or h.max_length,
            "generation_num_beams": g.num_beams,
        }
    return arguments_class(
        **extra,
        output_dir=str(run.checkpoints),
        metrics_path=str(run.metrics_path),
        use_ort=bool(a.ort),
        ort_fallback=a.ort_fallback,
        ort_log_level="ERROR",  # ORT's export chatter hides the progress; ortlab reports fallbacks itself
        optim="adamw_ort_fused" if a.fused_adam else "adamw_torch",
        zero_stage=a.zero_stage,
        fp16=a.precision == "fp16",
        bf16=a.precision == "bf16",
        torch_compile=a.torch_compile,
        # Explicit either way: left at None, transformers turns TF32 on by itself for torch_compile runs.
        tf32=bool(a.tf32),
        **_dataloader_settings(),
        learning_rate=h.learning_rate,
        num_train_epochs=h.epochs,
        max_steps=h.max_steps or -1,
        per_device_train_batch_size=h.batch_size,
        per_device_eval_batch_size=h.eval_batch_size,
        gradient_accumulation_steps=h.gradient_accumulation_steps,
        warmup_steps=h.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of all steps
        weight_decay=h.weight_decay,
        logging_steps=h.logging_steps,
        eval_strategy="steps" if h.eval_steps else "no",
        eval_steps=h.eval_steps,
        save_strategy="steps" if h.save_steps else "no",
        save_steps=h.save_steps or 500,
        seed=spec.seed,
        data_seed=spec.seed,
        # Experiment trackers (ortlab.trackers): offline, in the run folder, with ortlab's config. trackio must not
        # publish a Space after training: trackio_static_space_id=False.
        report_to=list(spec.report_to),
        project="ortlab",
        run_name=run.id,
        trackio_static_space_id=False,
        ortlab_config=run_config(spec, a) if spec.report_to else None,
        disable_tqdm=not progress,
    )


COMPILE_PAD_MULTIPLE = 8


def _dataloader_settings() -> dict[str, Any]:
    """On CUDA: pinned host memory (faster, asynchronous copies to the GPU; transformers' default there) and two
    loader workers where the machine has 4+ cores, so collation overlaps the GPU's step. On CPU: the main process
    only (workers would take cores from training), as before."""
    import torch

    if not torch.cuda.is_available():
        return {"dataloader_num_workers": 0}
    workers = 2 if (os.cpu_count() or 1) >= 4 else 0
    return {
        "dataloader_pin_memory": True,
        "dataloader_num_workers": workers,
        "dataloader_persistent_workers": workers > 0,
    }


def train_spec(
    spec: RunSpec,
    progress: bool = True,
    on_metrics: Callable[[dict], None] | None = None,
    log: Callable[[str], None] = print,
    terminal: Terminal | None = None,
) -> dict[str, Any]:
    """Check, then train `spec` in this process (the foreground `ortlab train`). Returns the result.

    The machine check comes first, in seconds: this process is the target, so the mix is checked here (MixError,
    each broken rule with its fix; `launch` checks a launched run against its target's doctor instead). Then the
    data and the model (`ortlab.fit.check`), then the training.

    With a `terminal` (`ortlab train`), ortlab's lines and a progress bar go to the screen and everything else
    this process prints (third-party libraries) to the run's logs/run.log.
    """
    from ortlab.accel.mix import MixError, runtime_for, validate
    from ortlab.trackers import not_installed

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
    if terminal is not None:
        log = terminal.plain  # its lines carry names and paths from the spec: never read as rich markup
        log(f"checking the model ({spec.model.name}) and the data ({spec.data.source}) ...")
    checked = check(spec, log)
    run = RunDir.create(spec.output_dir, spec)
    if terminal is not None:
        terminal.log_to(run.log_path)
    pid = os.getpid()
    run.set_status("pending", pid=pid, create_time=process_create_time(pid))
    return execute(run, checked=checked, progress=progress, on_metrics=on_metrics, log=log, terminal=terminal)


def execute(
    run: RunDir,
    resume: bool = False,
    checked: tuple | None = None,
    progress: bool = True,
    on_metrics: Callable[[dict], None] | None = None,
    log: Callable[[str], None] = print,
    terminal: Terminal | None = None,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Train the run in `run` (resuming from its last checkpoint if asked); keep its status true throughout.

    `callbacks`: more `TrainerCallback`s, for a launcher that must act at a point of training (a Ray Train worker
    uploads each checkpoint to an object store once every rank has written its part)."""
    # The run's log stays open while this process runs it, until its final status is written: how readers tell
    # this process (a notebook kernel too) from one that a forged status.json names (`rundir.run_process`).
    try:
        held: int | None = run.open_log()
    except OSError:
        held = None  # a planted link at logs/run.log: readers will call this run damaged, which it is
    try:
        return _execute(run, resume, checked, progress, on_metrics, log, terminal, callbacks)
    finally:
        if held is not None:
            os.close(held)


def _execute(run, resume, checked, progress, on_metrics, log, terminal, callbacks=()) -> dict[str, Any]:
    started = time.monotonic()
    stop = StopRequested(run)
    previous = signal.getsignal(signal.SIGTERM)
    if _is_main_thread():
        signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "flag", True))
    rank = int(os.environ.get("RANK", "0"))
    try:
        spec = RunSpec.from_run(run)
        if rank == 0:
            run.set_status(
                "running",
                started=time.time(),
                worker_pid=os.getpid(),
                python=sys.executable,
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                step=run.last_step(),
            )
        model_path, prepared = checked or check(spec, log)
        from ortlab.trackers import offline

        with offline(spec.report_to, run.path):
            result = _train(
                spec, run, model_path, prepared, resume, stop, progress, on_metrics, log, terminal, callbacks
            )
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
            write_json(run.result_path, result)
            run.set_status("completed", step=result["summary"]["steps"])
    return result


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _train(
    spec, run, model_path, prepared, resume, stop, progress, on_metrics, log, terminal=None, callbacks=()
) -> dict[str, Any]:
    log("loading the model (importing torch and transformers first takes a moment) ...")
    loading = time.monotonic()
    from transformers import set_seed

    from ortlab.data import collator, tokenize
    from ortlab.scores import add_perplexity, argmax_logits, compute_metrics_for
    from ortlab.tasks import TASK_FEATURES, load_model, load_tokenizer
    from ortlab.train.trainer import ORTTrainer

    set_seed(spec.seed)  # a new classification head is initialised at load: same seed, same run
    spec = fitted(spec, prepared)
    tokenizer = load_tokenizer(model_path, spec.model.revision)
    model = load_model(model_path, spec.task, prepared.label_names, spec.model.revision, tokenizer.pad_token_id)
    params = sum(p.numel() for p in model.parameters())
    log(f"model loaded: {type(model).__name__}, {params / 1e6:.1f}M parameters ({time.monotonic() - loading:.1f} s)")
    if spec.adapter.kind == "lora":
        from ortlab.adapters import apply_lora, parameter_counts

        model = apply_lora(model, spec.adapter, spec.task)
        counts = parameter_counts(model)
        log(
            f"LoRA adapter: {counts['trainable'] / 1e6:.2f}M of {counts['total'] / 1e6:.1f}M parameters train "
            f"({100 * counts['trainable'] / counts['total']:.2f}%)"
        )
    note = _new_head_note(model_path, spec, prepared.label_names)
    if note:
        log(note)
    train_ds, eval_ds = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length, spec.hyper.max_target_length)
    if prepared.chat:
        log(
            f"chat data: {len(train_ds)} train rows"
            + (" (packed)" if prepared.packing else "")
            + f", {len(eval_ds)} eval"
        )
    generated = spec.task == "seq2seq" and spec.generation.predict_with_generate
    # Only ids are needed to score; generated ids already are ids, and a causal LM is scored by its loss.
    argmax = spec.task != "causal-lm" and not generated
    # torch.compile: lengths padded to a multiple of 8, so Dynamo sees few distinct shapes (COMPILE_PAD_MULTIPLE).
    pad = COMPILE_PAD_MULTIPLE if spec.accel.torch_compile else None
    collate = collator(spec.task, tokenizer, model, prepared, pad_to_multiple_of=pad)
    # A resumed run keeps the mix it started with; a new one decides what 'auto' means here (maybe measuring).
    if resume:
        choice = _stored_choice(run)
    else:
        choice = _auto_mix(spec, run, model, model_path, prepared, train_ds, collate, log)
    if prepared.packing and (choice or {}).get("ort") and spec.accel.ort == "auto":
        # Packed rows carry no attention_mask (the examples' bounds are in position_ids), and ORTModule's export
        # of decoder models needs an explicit one: 'auto' yields to packing, and says so.
        choice = {**choice, "ort": False}
        log("auto accelerations: ort=False (packing passes example bounds as position_ids, which ORT cannot export)")
    generations = _generations(spec, run, prepared, log)
    trainer_class = ORTTrainer
    if spec.task == "seq2seq":
        from ortlab.train.seq2seq import ORTSeq2SeqTrainer

        trainer_class = ORTSeq2SeqTrainer
    args = training_arguments(spec, run, progress and (terminal is None or terminal.verbose), choice)
    # Lazy rows keep their raw columns until the transform gives the model's inputs: none to remove.
    args.remove_unused_columns = not prepared.lazy
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=collate,
        processing_class=tokenizer,
        compute_metrics=compute_metrics_for(spec.task, prepared.label_names, tokenizer, generated),
        preprocess_logits_for_metrics=argmax_logits if argmax else None,
        feature=TASK_FEATURES[spec.task],
        on_metrics=_both(terminal.on_record, on_metrics) if terminal is not None else on_metrics,
        callbacks=[
            stop_callback(stop),
            *([terminal.callback()] if terminal is not None else []),
            *([generations] if generations is not None else []),
            *callbacks,
        ],
    )
    # Steps already in the stream (a killed run, or a restarted worker group, trains again from an earlier
    # checkpoint) are not written twice: every view counts each step once.
    trainer.step_metrics.recorded_through = run.last_step()
    if generations is not None:
        generations.trainer = trainer
        generations.sink = trainer.metrics_sink if trainer.is_world_process_zero() else (lambda record: None)
    score = add_perplexity if spec.task == "causal-lm" else dict
    emit = trainer.metrics_sink if trainer.is_world_process_zero() else (lambda record: None)
    checkpoint = run.last_checkpoint() if resume else None
    if resume and checkpoint is None:
        raise RuntimeError(f"cannot resume {run.id}: it has no complete checkpoint in {run.checkpoints}")
    if checkpoint is None:
        trainer.eval_phase = "before"  # the metrics callback writes the eval record, tagged with its phase
        log(f"evaluating on {len(eval_ds)} rows before training ...")
        before = score(trainer.evaluate(metric_key_prefix="eval"))
        log("before training: " + _headline(before))
    else:
        before = _previous_eval(run) or {}
        emit({"event": events.RESUME, "step": int(checkpoint.name.split("-")[-1]), "checkpoint": str(checkpoint)})
        log(f"resuming from {checkpoint}")
    trainer.eval_phase = None
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if stop.flag:
        last = run.last_checkpoint()
        emit({"event": events.STOPPED, "step": trainer.state.global_step, "checkpoint": str(last)})
        trainer.metrics_sink.close()
        log(f"stopped at step {trainer.state.global_step}; checkpoint {last}")
        return {"stopped": True, "step": trainer.state.global_step, "checkpoint": str(last)}
    trainer.eval_phase = "after"
    log(f"evaluating on {len(eval_ds)} rows after training ...")
    after = score(trainer.evaluate(metric_key_prefix="eval"))
    trainer.metrics_sink.close()
    if spec.report_to:
        from ortlab.trackers import finish

        finish(trainer.callback_handler.callbacks)
    log("after training:  " + _headline(after))
    log(f"saving the {'adapter' if spec.adapter.kind == 'lora' else 'model'} to {run.model_dir}")
    trainer.save_model(str(run.model_dir))
    adapter = _adapter_record(trainer.model, spec)  # before a merge folds the adapter away
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(run.model_dir))
        if spec.adapter.kind == "lora" and spec.adapter.save_merged:
            _save_merged(trainer, tokenizer, run, log)
    return {
        "run_dir": str(run.path),
        "task": spec.task,
        "model": spec.model.name,
        "data": spec.data.source,
        "label_names": prepared.label_names,
        "eval_before": before,
        "eval_after": after,
        "summary": _summary(run, trainer),
        "accelerations": {k: v.to_dict() for k, v in trainer.accelerations.items()},
        "parameters": trainer.parameters_record,
        "adapter": adapter,
    }


def _generations(spec: RunSpec, run: RunDir, prepared: Any, log: Callable[[str], None]) -> Any:
    """The callback that answers a few fixed prompts at each evaluation (causal-lm: chat data or the user's
    prompts), or None when this run has nothing to ask."""
    g = spec.generation
    if spec.task != "causal-lm" or not (g.prompts or prepared.chat) or not (g.num_prompts or g.score_examples):
        return None
    from ortlab.chat import generations_callback, prompts_for

    n = max(g.num_prompts, 0 if g.prompts else g.score_examples)
    asked, references = prompts_for(g.prompts, prepared.conversations("eval", n) if prepared.chat else [], n)
    log(
        f"generations: {min(g.num_prompts, len(asked))} prompt(s) answered at each evaluation"
        + (f", exact match over {sum(r is not None for r in references)} eval answers" if any(references) else "")
    )
    return generations_callback(run.path, asked, references, g.num_prompts, g.max_new_tokens, lambda record: None)


def _adapter_record(model: Any, spec: RunSpec) -> dict[str, Any] | None:
    from ortlab.adapters import adapter_summary

    summary = adapter_summary(model)
    if summary is not None:
        summary.update(base_model=spec.model.name, merged=spec.adapter.save_merged)
    return summary


def _save_merged(trainer: Any, tokenizer: Any, run: RunDir, log: Callable[[str], None]) -> None:
    """model/merged/: the base model with the adapter folded in, a plain transformers folder (no peft needed).
    Last thing the run does: merging changes the trained model in place."""
    from ortlab.adapters import merge

    merged_dir = run.model_dir / "merged"
    log(f"saving the merged model to {merged_dir}")
    merged = merge(trainer.model)
    config = getattr(merged, "config", None)
    if config is not None and trainer._user_use_cache is not None:
        config.use_cache = trainer._user_use_cache
    merged.save_pretrained(str(merged_dir))
    tokenizer.save_pretrained(str(merged_dir))


def _auto_mix(spec, run, model, model_path, prepared, train_ds, collate, log) -> dict[str, Any] | None:
    """Decide the accelerations left at 'auto' (measuring them here if accel.tune says so, else probing the
    precision on `model`, the run's own) and record why.

    The decision goes to the metrics stream (an `auto` record, with the precision probe's timings when it ran) and,
    with the measured table, to tune.json in the run folder, so a run always says why ORT or bf16 was on or off.
    """
    from ortlab.train.metrics import JsonLinesSink
    from ortlab.tune.result import TuneResult

    rank0 = int(os.environ.get("RANK", "0")) == 0
    if prepared.streamed:  # a stream has no length to plan steps from, nor rows to draw measuring batches from
        choice, result, why = None, None, "not measured: the data is streamed; the conservative default applies"
    else:
        choice, result, why = decide(
            spec,
            model_path=model_path,
            label_names=prepared.label_names,
            train_dataset=train_ds,
            collate=collate,
            progress=log,
            log_dir=run.path / "logs",
            model=model,
        )
    resolved = resolve(spec.accel, choice)
    auto = {f: getattr(resolved, f) for f in spec.accel.auto_fields()}
    if rank0:
        tuned = isinstance(result, TuneResult)
        if tuned:
            write_json(run.path / "tune.json", result.to_dict())
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


def _stored_choice(run: RunDir) -> dict[str, Any] | None:
    """A resumed run trains with the mix it started with (its `auto` record), not a new decision."""
    for record in run.records():
        if record.get("event") == events.AUTO:
            return record.get("choice")
    return None


def _both(*sinks: Callable[[dict], None] | None) -> Callable[[dict], None]:
    def call(record: dict) -> None:
        for sink in sinks:
            if sink is not None:
                sink(record)

    return call


def _new_head_note(model_path: str, spec: RunSpec, label_names: list[str]) -> str | None:
    """In ortlab's words, what transformers' LOAD REPORT says when a classifier head is created: a new head starts
    from random weights (so the scores before training are about chance, by design)."""
    if not label_names:
        return None
    from transformers import AutoConfig

    from ortlab.tasks import TASK_FEATURES, get_feature

    saved = AutoConfig.from_pretrained(model_path, revision=spec.model.revision)
    suffix = get_feature(TASK_FEATURES[spec.task]).head_suffix
    has_head = any(a.endswith(suffix) for a in (saved.architectures or []))
    if has_head and len(getattr(saved, "id2label", {}) or {}) == len(label_names):
        return None
    shown = ", ".join(label_names[:6]) + (", ..." if len(label_names) > 6 else "")
    return (
        f"new {spec.task.replace('-', ' ')} head for {len(label_names)} labels ({shown}): it starts from random "
        "weights and learns in this run, so the scores before training are about chance"
    )


def _previous_eval(run: RunDir) -> dict[str, Any] | None:
    from ortlab.runfolder.stream import summary_of

    return summary_of(run.path).eval_before


def _summary(run: RunDir, trainer: Any) -> dict[str, Any]:
    """Throughput over the whole run, resumed parts included (each part has its own warm-up)."""
    from ortlab.runfolder.compare import summarize

    return summarize(run.records(), trainer.args.metrics_warmup_steps)


def _headline(metrics: dict[str, float]) -> str:
    keys = ("eval_accuracy", "eval_f1", "eval_exact_match", "eval_token_f1", "eval_token_accuracy")
    keys += ("eval_perplexity", "eval_loss")
    return ", ".join(f"{k[5:]} {metrics[k]:.4f}" for k in keys if k in metrics)


def worker_main(argv: list[str] | None = None) -> int:
    """`python -m ortlab.runner.worker RUN_DIR [--resume]`: the launched run process."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m ortlab.runner.worker")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    run = RunDir(a.run_dir)
    try:
        execute(run, resume=a.resume, progress=False)
    except Exception:
        traceback.print_exc()
        return 1
    return 0
