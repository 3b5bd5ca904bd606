"""Assembly: from a checked spec to a trainer. The model and its tokenizer, the tokenized data and its collator
(`load`), then the `TrainingArguments` and the trainer with its callbacks (`build_trainer`).

Assembly decides nothing about the run: the accelerations left at 'auto' arrive as a `choice` (decided or read
back by `ortlab.lifecycle.execute`), and what watches the run arrives as callbacks. It logs what it loads, since
a model load is the slowest silent moment of a run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ortlab.accel.mix import resolve
from ortlab.adapters import apply_lora, parameter_counts
from ortlab.chat import generations_callback, prompts_for
from ortlab.data import Prepared, collator
from ortlab.data.shards import for_process
from ortlab.fit import fitted
from ortlab.runfolder.rundir import RunDir
from ortlab.scores import argmax_logits, compute_metrics_for
from ortlab.spec import RunSpec
from ortlab.tasks import load_model, load_tokenizer
from ortlab.toggles import mix_arguments
from ortlab.trackers import run_config

# torch.compile: lengths padded to a multiple of 8, so Dynamo sees few distinct shapes.
COMPILE_PAD_MULTIPLE = 8


@dataclass
class Loaded:
    """What a run trains: its spec fitted to the data (`fit.fitted`), the data, the model and its tokenizer, the
    tokenized splits and the collator."""

    spec: RunSpec
    prepared: Prepared
    tokenizer: Any
    model: Any
    train_ds: Any
    eval_ds: Any
    collate: Callable


def load_model_and_data(spec: RunSpec, model_path: str, prepared: Prepared, log: Callable[[str], None]) -> Loaded:
    """Load the model (with its LoRA adapter) and its tokenizer, and tokenize the checked data."""
    log("loading the model (importing torch and transformers first takes a moment) ...")
    loading = time.monotonic()
    from transformers import set_seed

    set_seed(spec.seed)  # a new classification head is initialised at load: same seed, same run
    spec = fitted(spec, prepared)
    tokenizer = load_tokenizer(model_path, spec.model.revision)
    model = load_model(model_path, spec.task, prepared.label_names, spec.model.revision, tokenizer.pad_token_id)
    params = sum(p.numel() for p in model.parameters())
    log(f"model loaded: {type(model).__name__}, {params / 1e6:.1f}M parameters ({time.monotonic() - loading:.1f} s)")
    if spec.adapter.kind == "lora":
        model = apply_lora(model, spec.adapter, spec.task)
        counts = parameter_counts(model)
        log(
            f"LoRA adapter: {counts['trainable'] / 1e6:.2f}M of {counts['total'] / 1e6:.1f}M parameters train "
            f"({100 * counts['trainable'] / counts['total']:.2f}%)"
        )
    note = _new_head_note(model_path, spec, prepared.label_names)
    if note:
        log(note)
    tokenize = spec.task_record.part("tokenize")  # ortlab.data.inputs.tokenize, or the task's own
    train_ds, eval_ds = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length, spec.hyper.max_target_length)
    if prepared.chat and prepared.lazy:
        log(f"chat data: train rows templated{' and packed' if prepared.packing else ''} as read, {len(eval_ds)} eval")
    elif prepared.chat:
        log(
            f"chat data: {len(train_ds)} train rows"
            + (" (packed)" if prepared.packing else "")
            + f", {len(eval_ds)} eval"
        )
        if prepared.dropped is not None and prepared.dropped.dropped:
            log(prepared.dropped.note(spec.hyper.max_length))
    pad = COMPILE_PAD_MULTIPLE if spec.accel.torch_compile else None
    collate = collator(spec.task, tokenizer, model, prepared, pad_to_multiple_of=pad)
    return Loaded(spec, prepared, tokenizer, model, train_ds, eval_ds, collate)


def build_trainer(
    loaded: Loaded,
    run: RunDir,
    choice: dict[str, Any] | None,
    progress: bool,
    on_metrics: Callable[[dict], None] | None,
    callbacks: Sequence[Any],
    log: Callable[[str], None],
) -> Any:
    """The trainer of `loaded`, writing into `run`, with the accelerations left at 'auto' as `choice` says, and
    `callbacks` (stopping, a view's progress, a launcher's own), and the callback that answers the spec's prompts at
    each evaluation when there are any. Its metrics stream continues after the steps the run folder already holds."""
    spec, prepared, task = loaded.spec, loaded.prepared, loaded.spec.task_record
    generated = task.generates and spec.generation.predict_with_generate
    # Only ids are needed to score; generated ids already are ids, and a causal LM is scored by its loss.
    argmax = task.argmax and not generated
    generations = _generations(spec, run, prepared, log)
    trainer_class = task.part("trainer")  # ORTTrainer, or the task's own subclass of it
    args = training_arguments(spec, run, progress, choice)
    # Lazy rows keep their raw columns until the transform gives the model's inputs: none to remove.
    args.remove_unused_columns = not prepared.lazy
    train_ds = loaded.train_ds
    if prepared.streamed:  # each process reads its own rows of the stream (ortlab.data.shards)
        held_out = spec.data.eval_split is None  # the stream starts after the eval rows it held out
        train_ds = for_process(train_ds, args.process_index, args.world_size, held_out)
    trainer = trainer_class(
        model=loaded.model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=loaded.eval_ds,
        data_collator=loaded.collate,
        processing_class=loaded.tokenizer,
        compute_metrics=compute_metrics_for(spec.task, prepared.label_names, loaded.tokenizer, generated),
        preprocess_logits_for_metrics=argmax_logits if argmax else None,
        feature=task.feature.name,
        on_metrics=on_metrics,
        # The generations callback answers at on_evaluate only: after the view's own on_evaluate (its eval bar
        # closes before the answers are printed), and apart from every other callback's events.
        callbacks=[*callbacks, *([generations] if generations is not None else []), *_dropped_report(loaded, log)],
    )
    # Steps already in the stream (a killed run, or a restarted worker group, trains again from an earlier
    # checkpoint) are not written twice: every view counts each step once.
    trainer.step_metrics.recorded_through = run.last_step()
    trainer.perplexity = task.perplexity
    if generations is not None:
        generations.trainer = trainer
        generations.sink = trainer.metrics_sink if trainer.is_world_process_zero() else (lambda record: None)
    return trainer


def training_arguments(spec: RunSpec, run: RunDir, progress: bool, choice: dict[str, Any] | None = None):
    """TrainingArguments for `spec`; the accelerations left at 'auto' take `choice` (a measurement) if given."""
    from ortlab.train.args import checkpointing_arguments

    a, h, task = resolve(spec.accel, choice), spec.hyper, spec.task_record
    arguments_class, extra = task.part("arguments"), {}  # ORTTrainingArguments, or the task's own
    if task.generates:
        g = spec.generation
        extra = {
            "predict_with_generate": g.predict_with_generate,
            "generation_max_length": g.max_length or h.max_target_length or h.max_length,
            "generation_num_beams": g.num_beams,
        }
    if task.pairs:
        p = spec.preference
        extra = {
            "preference_loss": p.loss,
            "beta": p.beta,
            "label_smoothing": p.label_smoothing,
            "reference": p.reference,
            "max_length": h.max_length,
        }
    return arguments_class(
        **extra,
        output_dir=str(run.checkpoints),
        metrics_path=str(run.metrics_path),
        # The mix, by each toggle's own mapping (`ortlab.toggles`); 'auto' ORT yields to gradient checkpointing, as
        # it does to torch_compile (ORT's backward graph would not recompute; an explicit `ort: true` with it is
        # refused by the spec)
        **{**mix_arguments(a.model_dump()), "use_ort": bool(a.ort) and not h.gradient_checkpointing},
        ort_fallback=a.ort_fallback,
        ort_log_level="ERROR",  # ORT's export chatter hides the progress; ortlab reports fallbacks itself
        **_dataloader_settings(),
        learning_rate=h.learning_rate,
        num_train_epochs=h.epochs,
        max_steps=h.max_steps or -1,
        per_device_train_batch_size=h.batch_size,
        per_device_eval_batch_size=h.eval_batch_size,
        gradient_accumulation_steps=h.gradient_accumulation_steps,
        # (in the installed transformers' spelling: `checkpointing_arguments`.) torch's non-reentrant checkpoint:
        # gradients reach a LoRA adapter behind frozen embeddings without `enable_input_require_grads`, and the
        # recomputed forward replays the same dropout masks.
        **checkpointing_arguments(
            h.gradient_checkpointing, {"use_reentrant": False} if h.gradient_checkpointing else None
        ),
        warmup_steps=h.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of all steps
        weight_decay=h.weight_decay,
        logging_steps=h.logging_steps,
        eval_strategy="steps" if h.eval_steps else "no",
        eval_steps=h.eval_steps,
        save_strategy="steps" if h.save_steps else "no",
        save_steps=h.save_steps or 500,
        seed=spec.seed,
        data_seed=spec.seed,
        train_sampling_strategy="random" if spec.data.shuffle else "sequential",
        # Experiment trackers (ortlab.trackers): offline, in the run folder, with ortlab's config. trackio must not
        # publish a Space after training: trackio_static_space_id=False.
        report_to=list(spec.report_to),
        project="ortlab",
        run_name=run.id,
        trackio_static_space_id=False,
        ortlab_config=run_config(spec, a) if spec.report_to else None,
        disable_tqdm=not progress,
    )


def _dropped_report(loaded: Loaded, log: Callable[[str], None]) -> list[Any]:
    """Lazy chat data: the callback that says at the end how many cut-off examples training read and dropped."""
    if not (loaded.prepared.chat and loaded.prepared.lazy):
        return []
    from ortlab.data.lazylm import report_callback

    return [report_callback(loaded.prepared, loaded.spec.hyper.max_length, log)]


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


def _generations(spec: RunSpec, run: RunDir, prepared: Prepared, log: Callable[[str], None]) -> Any:
    """The callback that answers a few fixed prompts at each evaluation (causal-lm: chat data or the user's
    prompts), or None when this run has nothing to ask."""
    g = spec.generation
    if (
        not spec.task_record.answers_prompts
        or not (g.prompts or prepared.chat)
        or not (g.num_prompts or g.score_examples)
    ):
        return None
    n = max(g.num_prompts, 0 if g.prompts else g.score_examples)
    asked, references = prompts_for(g.prompts, prepared.conversations("eval", n) if prepared.chat else [], n)
    log(
        f"generations: {min(g.num_prompts, len(asked))} prompt(s) answered at each evaluation"
        + (f", exact match over {sum(r is not None for r in references)} eval answers" if any(references) else "")
    )
    return generations_callback(run.path, asked, references, g.num_prompts, g.max_new_tokens, lambda record: None)


def _new_head_note(model_path: str, spec: RunSpec, label_names: list[str]) -> str | None:
    """In ortlab's words, what transformers' LOAD REPORT says when a classifier head is created: a new head starts
    from random weights (so the scores before training are about chance, by design)."""
    if not label_names:
        return None
    from transformers import AutoConfig

    saved = AutoConfig.from_pretrained(model_path, revision=spec.model.revision)
    suffix = spec.task_record.feature.head_suffix
    has_head = any(a.endswith(suffix) for a in (saved.architectures or []))
    if has_head and len(getattr(saved, "id2label", {}) or {}) == len(label_names):
        return None
    shown = ", ".join(label_names[:6]) + (", ..." if len(label_names) > 6 else "")
    return (
        f"new {spec.task.replace('-', ' ')} head for {len(label_names)} labels ({shown}): it starts from random "
        "weights and learns in this run, so the scores before training are about chance"
    )
