"""Measure which acceleration mix trains fastest *here*, on the run's own model and batches, and pick it.

"Available here" is not "faster here": on a 2-core CPU ORTModule trains at ~0.8x eager PyTorch, bf16 is 10x
slower on a CPU without bf16 instructions and 1.6x faster on one with them. Only a measurement on the user's
model, shapes and machine can say which mix wins, so `tune` makes one:

- each candidate mix trains in its own process (ORTModule and DeepSpeed keep global state; peak memory must
  be per candidate), on the same saved batches of the run's own data, from the same seed;
- each process warms up (ORT's export, graph build, allocator) and reports that time apart, then waits;
- the driver then runs the candidates in interleaved slices (A B C A B C ...), so a busy machine slows every
  candidate alike, and compares each slice with the plain slice next to it (a paired ratio);
- a candidate whose loss is not finite or strays from the plain one is rejected; one whose acceleration did
  not really apply (ORT fell back) is rejected; the winner must beat plain in every round by more than the
  noise margin, or plain stays (the default must never lose).

The table (samples/s, warm-up, peak memory, why each lost) is cached per (model, shapes, candidates,
environment) under ortlab's cache folder, so the next run with the same model and shapes reuses it.

The parts, one module each (this package re-exports their public names, so `from ortlab.tune import X` stays):

- `mixes`: what to measure (`MixCandidate`, `candidate_mixes`);
- `measure`: how to measure, the driver (`tune_batches`, `Stepper`, the interleaved rounds);
- `child`: how to measure, one candidate's process (`python -m ortlab.tune`, `slice_callback`, the line protocol);
- `judge`: how to decide (`_judge`, `_clearly_faster`, the margins);
- `cache`: the keys and the JSON files under `ortlab.envvars.cache_dir()/tune`;
- `result`: what a measurement found (`Measured`, `TuneResult`, `TuneError`; stdlib only);
- `auto`: a RunSpec's ways in (`decide` for `ortlab.lifecycle.execute`, `tune_spec` for `ortlab tune`).

Importing this package imports no torch (the workbench reads a `TuneResult` in the notebook's kernel).
"""

from __future__ import annotations

from ortlab.tune.auto import AUTO_MIN_STEPS, BATCHES, batches_from, decide, planned_steps, tune_spec
from ortlab.tune.child import MARK, slice_callback
from ortlab.tune.judge import LOSS_ATOL, LOSS_RTOL, SIGN_ALPHA, WIN_MARGIN, _clearly_faster, _judge
from ortlab.tune.measure import (
    DEFAULT_BUDGET_S,
    MAX_ROUNDS,
    MIN_ROUNDS,
    SLICE_STEPS,
    WARMUP_STEPS,
    Stepper,
    tune_batches,
)
from ortlab.tune.mixes import MixCandidate, _compile_runtime, candidate_mixes
from ortlab.tune.result import Measured, TuneError, TuneResult
from ortlab.tune.resultcache import (
    CACHE_VERSION,
    cache_key,
    cached,
    measurement_environment,
    model_identity,
    tune_cache_dir,
)

__all__ = [
    "AUTO_MIN_STEPS",
    "BATCHES",
    "CACHE_VERSION",
    "DEFAULT_BUDGET_S",
    "LOSS_ATOL",
    "LOSS_RTOL",
    "MARK",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "SIGN_ALPHA",
    "SLICE_STEPS",
    "WARMUP_STEPS",
    "WIN_MARGIN",
    "Measured",
    "MixCandidate",
    "Stepper",
    "TuneError",
    "TuneResult",
    "_clearly_faster",
    "_compile_runtime",
    "_judge",
    "batches_from",
    "cache_key",
    "cached",
    "candidate_mixes",
    "decide",
    "measurement_environment",
    "model_identity",
    "planned_steps",
    "slice_callback",
    "tune_batches",
    "tune_cache_dir",
    "tune_spec",
]
