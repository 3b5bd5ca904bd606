"""Run a `RunSpec` in this process: check, load, tokenize, evaluate, train, evaluate, save.

The order matters: everything that can fail cheaply (the spec, the model's location, the data and its columns)
is checked before the run folder exists and before a model is loaded, so bad input fails in seconds and leaves
nothing behind that looks like a run. A run folder says what state it is in (`status.json`): it is only
`completed` once the model and the results are written.

    <output_dir>/<name>/spec.yaml            the spec, as run
    <output_dir>/<name>/status.json          pending -> running -> completed | failed (with error and traceback)
    <output_dir>/<name>/metrics.jsonl        the metrics stream (ortlab.train.metrics)
    <output_dir>/<name>/model/               the trained model and tokenizer (transformers format)
    <output_dir>/<name>/result.json          eval before/after, throughput summary, what applied
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ortlab.data import collator, load_and_check, tokenize
from ortlab.scores import add_perplexity, argmax_logits, compute_metrics_for
from ortlab.spec import RunSpec
from ortlab.tasks import TASK_FEATURES, load_model, load_tokenizer, resolve_model


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def new_run_dir(spec: RunSpec) -> Path:
    name = spec.name or f"{spec.task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    base = Path(spec.output_dir) / name
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    path.mkdir(parents=True)
    return path


def training_arguments(spec: RunSpec, run_dir: Path, progress: bool):
    from ortlab.train.args import ORTTrainingArguments

    a, h = spec.accel.resolved(), spec.hyper
    return ORTTrainingArguments(
        output_dir=str(run_dir / "checkpoints"),
        metrics_path=str(run_dir / "metrics.jsonl"),
        use_ort=bool(a.ort),
        ort_fallback=a.ort_fallback,
        ort_log_level="ERROR",  # ORT's export chatter hides the progress; ortlab reports fallbacks itself
        optim="adamw_ort_fused" if a.fused_adam else "adamw_torch",
        zero_stage=a.zero_stage,
        fp16=a.precision == "fp16",
        bf16=a.precision == "bf16",
        torch_compile=a.torch_compile,
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
        save_strategy="no",
        seed=spec.seed,
        data_seed=spec.seed,
        report_to=[],
        disable_tqdm=not progress,
    )


def train_spec(
    spec: RunSpec,
    progress: bool = True,
    on_metrics: Callable[[dict], None] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train `spec` here and return its result (also written to <run folder>/result.json)."""
    started = time.monotonic()
    # 1. Cheap checks, before anything is created or loaded.
    model_path = resolve_model(spec.model.name)
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    log(
        f"data: {len(prepared.train)} train / {len(prepared.eval)} eval rows, text={prepared.text_column!r}"
        + (f", label={prepared.label_column!r} ({prepared.num_labels} classes)" if prepared.label_column else "")
    )
    # 2. The run folder exists from here on, and always says what state it is in.
    run_dir = new_run_dir(spec)
    (run_dir / "spec.yaml").write_text(spec.to_yaml())
    write_json(run_dir / "status.json", {"state": "running", "pid": os.getpid(), "started": time.time()})
    try:
        result = _train(spec, run_dir, model_path, prepared, progress, on_metrics, log)
    except BaseException as e:
        write_json(
            run_dir / "status.json",
            {
                "state": "failed",
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
                "ended": time.time(),
            },
        )
        raise
    result["wall_time_s"] = time.monotonic() - started
    write_json(run_dir / "result.json", result)
    write_json(run_dir / "status.json", {"state": "completed", "ended": time.time()})
    return result


def _train(spec, run_dir, model_path, prepared, progress, on_metrics, log) -> dict[str, Any]:
    from ortlab.train.trainer import ORTTrainer

    tokenizer = load_tokenizer(model_path, spec.model.revision)
    model = load_model(model_path, spec.task, prepared.label_names, spec.model.revision)
    train_ds, eval_ds = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length)
    classify = spec.task != "causal-lm"
    trainer = ORTTrainer(
        model=model,
        args=training_arguments(spec, run_dir, progress),
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=collator(spec.task, tokenizer),
        processing_class=tokenizer,
        compute_metrics=compute_metrics_for(spec.task, prepared.label_names),
        preprocess_logits_for_metrics=argmax_logits if classify else None,
        feature=TASK_FEATURES[spec.task],
        on_metrics=on_metrics,
    )
    score = add_perplexity if spec.task == "causal-lm" else dict
    before = score(trainer.evaluate(metric_key_prefix="eval"))
    trainer.metrics_sink({"event": "eval", "phase": "before", "step": 0, **before})
    log("before training: " + _headline(before))
    trainer.train()
    after = score(trainer.evaluate(metric_key_prefix="eval"))
    trainer.metrics_sink({"event": "eval", "phase": "after", "step": trainer.state.global_step, **after})
    trainer.metrics_sink.close()
    log("after training:  " + _headline(after))
    model_dir = run_dir / "model"
    trainer.save_model(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    summary = trainer.step_metrics.summary(trainer.args.metrics_warmup_steps)
    return {
        "run_dir": str(run_dir),
        "task": spec.task,
        "model": spec.model.name,
        "data": spec.data.source,
        "label_names": prepared.label_names,
        "eval_before": before,
        "eval_after": after,
        "summary": summary,
        "accelerations": {k: v.to_dict() for k, v in trainer.accelerations.items()},
    }


def _headline(metrics: dict[str, float]) -> str:
    keys = ("eval_accuracy", "eval_f1", "eval_perplexity", "eval_loss")
    return ", ".join(f"{k[5:]} {metrics[k]:.4f}" for k in keys if k in metrics)
