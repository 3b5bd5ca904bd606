"""A RunSpec's ways in: `decide` (what its 'auto' accelerations become in a run, `ortlab.lifecycle.execute`) and
`tune_spec` (`ortlab tune`: check the spec's model and data, then measure).

Both take the run's own batches (`batches_from`: a seeded shuffle of its training data, real lengths) and hand
them to `ortlab.tune.measure.tune_batches`. Nothing here imports `ortlab.lifecycle` or `ortlab.runner`: the
trainer of a spec calls down into the tuner, never the other way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab.accel import tcmalloc
from ortlab.accel.mix import _cuda_available
from ortlab.data import collator, tokenize
from ortlab.fit import check_model_and_data, fitted
from ortlab.tasks import load_tokenizer
from ortlab.tune.measure import MAX_ROUNDS, SLICE_STEPS, WARMUP_STEPS, tune_batches
from ortlab.tune.precisionrace import MAX_ROUNDS as PROBE_ROUNDS
from ortlab.tune.precisionrace import MIN_ROUNDS as PROBE_MIN_ROUNDS
from ortlab.tune.precisionrace import PrecisionRace, candidate_precision, probe_precision
from ortlab.tune.result import TuneResult

AUTO_MIN_STEPS = 500  # accel.tune='auto' measures (when nothing is cached) only for runs at least this long
BATCHES = WARMUP_STEPS + MAX_ROUNDS * SLICE_STEPS


def batches_from(dataset: Any, collate: Callable, batch_size: int, seed: int, n: int = BATCHES) -> list[dict]:
    """The first `n` batches a seeded shuffle of the run's own training data gives (its real lengths).

    A stream (streamed data: an IterableDataset, no length) gives its head instead: the first `n` batches the run
    itself trains on, already in the run's seeded buffer-shuffled order. A DataLoader cannot shuffle a stream, and
    drawing from further in would read what streaming is there to leave unread."""
    import torch

    order = {}
    if hasattr(dataset, "__len__"):
        # The first n batches of `shuffle=True` with this generator, without its list of every index (a shuffled
        # DataLoader's sampler turns the whole permutation into Python ints: 130 MB for 3.6M rows).
        generator = torch.Generator().manual_seed(seed)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the loader's base seed, drawn first
        first = torch.randperm(len(dataset), generator=generator)[: n * batch_size]
        order = {"sampler": first.tolist()}
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate, **order)
    out: list[dict] = []
    for batch in loader:
        out.append({k: v for k, v in dict(batch).items() if hasattr(v, "shape")})
        if len(out) == n:
            break
    return out


def planned_steps(spec: Any, train_rows: int | None) -> int:
    """The optimizer steps a run of `spec` takes: hyper.max_steps, else the epochs over `train_rows` (a stream,
    `train_rows` None, always has max_steps: `ortlab.fit` refuses one without)."""
    h = spec.hyper
    if h.max_steps or train_rows is None:
        return h.max_steps or 0
    per_epoch = math.ceil(train_rows / (h.batch_size * h.gradient_accumulation_steps * spec.target.processes))
    return math.ceil(per_epoch * h.epochs)


def decide(
    spec: Any,
    *,
    model_path: str,
    label_names: list[str] | None,
    train_dataset: Any,
    collate: Callable,
    progress: Callable[[str], None] = print,
    log_dir: Path | None = None,
    model: Any = None,
) -> tuple[dict[str, Any] | None, TuneResult | PrecisionRace | None, str]:
    """What the spec's 'auto' fields become in this run: (choice or None for the default, measurement, why).

    The measurement is the tuner's table (`TuneResult`) when the mixes were measured (or cached), else, where the
    precision is 'auto' and `model` (the run's loaded model) is given, the precision probe's verdict."""
    a = spec.accel
    if not a.auto_fields():
        return None, None, "every acceleration is set explicitly: nothing to decide"
    if spec.target.processes > 1:
        # Each process would probe on its own and could decide differently: a group must train in one precision.
        return None, None, "not measured: ortlab tunes single-process runs only; the conservative default applies"
    if a.tune == "off":
        return None, None, "accel.tune is 'off': the conservative default (PyTorch with fused AdamW, fp32)"
    probing = model is not None and a.precision == "auto"
    if spec.adapter.kind != "none":
        # The measurement trains the full model; an adapter run's step (frozen base, a tiny optimizer) is another
        # workload, and a choice measured on the first would be a guess for the second. The precision probe runs
        # the adapter model itself, so it applies.
        why = "not measured: ortlab tunes full fine-tuning only; adapter runs get the conservative default"
        if not probing:
            return None, None, why
        rest = "ort, fused_adam: the default (adapter runs are not tuned)"
        return _probed(spec, model, model_path, train_dataset, collate, progress, rest)
    steps = planned_steps(spec, len(train_dataset) if hasattr(train_dataset, "__len__") else None)
    measure = a.tune == "measure" or steps >= AUTO_MIN_STEPS
    batches = batches_from(train_dataset, collate, spec.hyper.batch_size, spec.seed)
    result = tune_batches(
        batches,
        model_path=model_path,
        task=spec.task,
        label_names=label_names,
        revision=spec.model.revision,
        learning_rate=spec.hyper.learning_rate,
        weight_decay=spec.hyper.weight_decay,
        seed=spec.seed,
        measure=measure,
        tcmalloc=tcmalloc.loaded() is not None,  # the candidates get this run's allocator
        progress=progress,
        log_dir=log_dir,
    )
    if result is None:
        why = (
            f"not measured ({steps} steps; accel.tune='auto' measures runs of {AUTO_MIN_STEPS}+ steps): the "
            "conservative default (PyTorch with fused AdamW, fp32). `ortlab tune` or accel.tune='measure' "
            "measures which mix is fastest here"
        )
        if not probing:
            return None, None, why
        others = f"ort, fused_adam: the default, not measured for {steps} steps (`ortlab tune` measures every mix)"
        return _probed(spec, model, model_path, train_dataset, collate, progress, others, batches)
    how = "a cached measurement" if result.cached else f"measured in {result.calibration_s:.0f} s"
    return result.choice, result, f"{result.chosen} ({how}; table in tune.json)"


def _probed(
    spec: Any,
    model: Any,
    model_path: str,
    train_dataset: Any,
    collate: Callable,
    progress: Callable[[str], None],
    rest: str,
    batches: list[dict] | None = None,
) -> tuple[dict[str, Any] | None, PrecisionRace | None, str]:
    """The precision from the probe (the other 'auto' fields keep the conservative default); `why` says both,
    `rest` being why the others were not measured."""
    candidate, reason = candidate_precision()
    if candidate is None:
        return None, None, f"{reason}; {rest}"
    if candidate == "bf16" and spec.accel.ort is True and not _cuda_available():
        return None, None, f"fp32: this run asks for ort, whose CPU kernels have no bf16 matmul; {rest}"
    if batches is None:  # (the tuner's batches, when given, are all the data has: drawing again gives the same)
        batches = batches_from(train_dataset, collate, spec.hyper.batch_size, spec.seed, n=PROBE_ROUNDS + 1)
    if len(batches) < PROBE_MIN_ROUNDS + 1:
        why = f"fp32: too little training data to probe {candidate} ({len(batches)} batches); {rest}"
        return None, None, why
    probe = probe_precision(
        model, batches, model_path=model_path, revision=spec.model.revision, candidate=candidate, progress=progress
    )
    how = "a cached probe" if probe.cached else f"probed in {probe.probe_s:.0f} s"
    return {"precision": probe.chosen}, probe, f"{probe.verdict}, {how}; {rest}"


def tune_spec(
    spec: Any,
    progress: Callable[[str], None] = print,
    use_cache: bool = True,
    compile: bool = False,
    baselines: bool = False,
) -> TuneResult:
    """`ortlab tune`: check the spec's model and data, then measure its candidate mixes (or reuse the cache)."""
    model_path, prepared = check_model_and_data(spec, progress)
    spec = fitted(spec, prepared)
    tokenizer = load_tokenizer(model_path, spec.model.revision)
    train_ds, _ = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length, spec.hyper.max_target_length)
    batches = batches_from(
        train_ds, collator(spec.task, tokenizer, prepared=prepared), spec.hyper.batch_size, spec.seed
    )
    result = tune_batches(
        batches,
        model_path=model_path,
        task=spec.task,
        label_names=prepared.label_names,
        revision=spec.model.revision,
        learning_rate=spec.hyper.learning_rate,
        weight_decay=spec.hyper.weight_decay,
        seed=spec.seed,
        processes=spec.target.processes,
        use_cache=use_cache,
        compile=compile,
        baselines=baselines,
        tcmalloc=tcmalloc.wanted(spec.accel.tcmalloc),  # what a launched run of the spec would train with
        progress=progress,
    )
    assert result is not None  # measure=True always returns a result or raises
    return result
