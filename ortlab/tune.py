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

Candidate processes speak a line protocol on stdin/stdout (`ORTLAB-TUNE {json}` lines; any other output is
library noise); their stderr goes to a log file next to the measurement.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError

MARK = "ORTLAB-TUNE "
WARMUP_STEPS = 2  # step 1 holds ORT's export and graph build; step 2 settles the allocator
SLICE_STEPS = 1  # steps per interleaved slice: one batch, the same batch for every candidate in a round
MIN_ROUNDS, MAX_ROUNDS = 4, 12
SIGN_ALPHA = 0.1  # a mix beats plain only if it won so many rounds that chance explains it with p <= this
DEFAULT_BUDGET_S = 60.0
WIN_MARGIN = 0.03  # a mix must be >= 3 % faster than plain in the median, and faster in every round
LOSS_RTOL, LOSS_ATOL = 0.05, 0.05  # mean training loss over the measured steps, against plain's
AUTO_MIN_STEPS = 500  # accel.tune='auto' measures (when nothing is cached) only for runs at least this long
CACHE_VERSION = 1


class TuneError(OrtlabError, RuntimeError):
    """The measurement could not be made (the plain baseline itself failed); says why."""


@dataclass
class Candidate:
    """One mix to measure. `python` is the interpreter it runs in (a compile runtime for torch.compile)."""

    name: str
    ort: bool = False
    fused_adam: bool = False
    precision: str = "fp32"
    torch_compile: bool = False
    python: str | None = None
    skipped: str | None = None  # why it is not measured here (not available, known to be emulated, ...)

    def choice(self) -> dict[str, Any]:
        return {
            "ort": self.ort,
            "fused_adam": self.fused_adam,
            "precision": self.precision,
            "torch_compile": self.torch_compile,
        }


@dataclass
class Measured:
    """What one candidate measured, and its verdict."""

    name: str
    choice: dict[str, Any]
    samples_per_s: float | None = None  # median over the slices
    ratio: float | None = None  # median of the paired ratios to plain
    ratio_min: float | None = None
    ratio_max: float | None = None
    warmup_s: float | None = None
    peak_mem_mb: float | None = None
    mem_kind: str | None = None
    loss: float | None = None  # mean training loss over the measured steps
    applied: dict[str, bool] = field(default_factory=dict)
    verdict: str = ""  # "chosen", or why it lost / was not measured
    slices: list[float] = field(default_factory=list)


@dataclass
class TuneResult:
    chosen: str
    choice: dict[str, Any]
    candidates: list[Measured]
    rounds: int
    slice_steps: int
    calibration_s: float
    key: str
    environment: dict[str, Any]
    shapes: dict[str, Any]
    cached: bool = False
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuneResult:
        d = dict(d)
        d["candidates"] = [Measured(**m) for m in d["candidates"]]
        return cls(**d)

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate, for terminals, notebooks and model cards."""
        return [
            {
                "mix": m.name,
                "samples/s": m.samples_per_s,
                "vs plain": m.ratio,
                "spread": (m.ratio_min, m.ratio_max) if m.ratio_min is not None else None,
                "warm-up s": m.warmup_s,
                "peak MB": m.peak_mem_mb,
                "verdict": m.verdict,
            }
            for m in self.candidates
        ]


# --- which mixes ----------------------------------------------------------------------------------------------


def plan(processes: int = 1, use_cpu: bool = False, compile: bool = False) -> list[Candidate]:
    """The candidate mixes for this runtime, from the doctor's static checks (cheap; no probes run).

    torch.compile is measured only when asked (`compile=True`, `ortlab tune --compile`): its warm-up (about a
    minute on CPU, again for each new batch shape) is larger than the whole calibration budget, it moves the run
    to another runtime, and `accel.torch_compile` is never 'auto' (a user turns it on knowingly).
    """
    from ortlab.accel import fused_adam, ort, precision, torch_compile
    from ortlab.accel.mix import _cuda_available

    cuda = _cuda_available() and not use_cpu
    ort_ok, fused_ok = ort.check(), fused_adam.check()
    out = [Candidate("plain")]
    out.append(Candidate("fused_adam", fused_adam=True, skipped=None if fused_ok.available else fused_ok.reason))
    # ORT is measured with fused AdamW where that exists: the optimizer step is outside ORT's graph, so fused
    # AdamW's gain adds to ORT's as it adds to plain PyTorch's, and one ORT export fewer keeps the calibration
    # near its 60 s budget on 2 cores. Without fused AdamW, ORT is measured alone.
    ort_why = None if ort_ok.available else ort_ok.reason
    if fused_ok.available:
        separately = "not measured: fused AdamW is independent of ORT's graph; ort+fused_adam measures ORT"
        out.append(Candidate("ort", ort=True, skipped=ort_why or separately))
        out.append(Candidate("ort+fused_adam", ort=True, fused_adam=True, skipped=ort_why))
    else:
        out.append(Candidate("ort", ort=True, skipped=ort_why))
        out.append(Candidate("ort+fused_adam", ort=True, fused_adam=True, skipped=ort_why or fused_ok.reason))
    bf16 = precision.check_bf16()
    bf16_why = None
    if not bf16.available:
        bf16_why = bf16.reason
    elif bf16.slow and not cuda:
        bf16_why = f"not measured: {bf16.reason}"
    out.append(Candidate("bf16+fused_adam", fused_adam=fused_ok.available, precision="bf16", skipped=bf16_why))
    if cuda:
        out.append(Candidate("fp16+fused_adam", fused_adam=fused_ok.available, precision="fp16"))
    compiled = torch_compile.check()
    compile_python = None if compiled.available else _compile_runtime()
    if not compile:
        why = "not measured: its warm-up exceeds the calibration budget; `ortlab tune --compile` measures it"
        out.append(Candidate("torch_compile", torch_compile=True, skipped=why))
    elif compiled.available or compile_python:
        out.append(Candidate("torch_compile+fused_adam", fused_adam=True, torch_compile=True, python=compile_python))
    else:
        out.append(Candidate("torch_compile", torch_compile=True, skipped=compiled.reason))
    if processes > 1:
        for c in out:
            if c.name != "plain" and c.skipped is None:
                c.skipped = "not measured: ortlab tunes single-process runs only (processes > 1)"
    return out


def _compile_runtime() -> str | None:
    """The interpreter of ortlab's compile runtime (torch >= 2.7), if one was created (`ortlab runtime`)."""
    try:
        from ortlab import runtimes
    except ImportError:
        return None
    path = runtimes.python_for("compile")
    return str(path) if path else None


# --- cache ----------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    from ortlab.envvars import cache_dir as ortlab_cache

    return ortlab_cache() / "tune"


def environment() -> dict[str, Any]:
    """What makes a measurement valid only here: the processor, the accelerator, the library versions."""
    from ortlab.accel import package_version

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {
            d: package_version(d) for d in ("torch", "transformers", "onnxruntime-training", "deepspeed", "ortlab")
        },
    }
    import torch

    if torch.cuda.is_available():
        env["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    env["threads"] = torch.get_num_threads()
    return env


def model_identity(model_path: str, revision: str | None) -> dict[str, Any]:
    """A local folder by its config and weight files (a changed checkpoint is another model); a Hub id by id."""
    path = Path(model_path)
    if not path.is_dir():
        return {"id": model_path, "revision": revision}
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.name == "config.json":
            digest.update(f.read_bytes())
        elif f.suffix in (".safetensors", ".bin", ".gguf"):
            digest.update(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}".encode())
    return {"folder": str(path.resolve()), "files": digest.hexdigest()[:16]}


def cache_key(identity: dict, shapes: dict, candidates: list[Candidate], env: dict) -> str:
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "model": identity,
            "shapes": shapes,
            "candidates": [asdict(c) for c in candidates],
            "env": env,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached(key: str) -> TuneResult | None:
    path = cache_dir() / f"{key}.json"
    try:
        result = TuneResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    result.cached = True
    return result


def _store(result: TuneResult) -> None:
    from ortlab.runfolder.rundir import write_json

    cache_dir().mkdir(parents=True, exist_ok=True)
    write_json(cache_dir() / f"{result.key}.json", result.to_dict())


# --- the driver -----------------------------------------------------------------------------------------------


def tune_batches(
    batches: list[dict],
    *,
    model_path: str,
    task: str,
    label_names: list[str] | None,
    revision: str | None = None,
    learning_rate: float = 5e-5,
    weight_decay: float = 0.0,
    seed: int = 42,
    processes: int = 1,
    budget_s: float = DEFAULT_BUDGET_S,
    use_cache: bool = True,
    measure: bool = True,
    compile: bool = False,
    progress: Callable[[str], None] = print,
    log_dir: Path | None = None,
) -> TuneResult | None:
    """Measure the candidate mixes on `batches` (collated batches of the run's own data) and pick the fastest.

    With `measure=False` only a cached measurement is returned (None when there is none).
    """
    candidates = plan(processes, compile=compile)
    shapes = {
        "task": task,
        "batch_shapes": sorted({tuple(b["input_ids"].shape) for b in batches}),
        "labels": len(label_names or []),
    }
    shapes["batch_shapes"] = [list(s) for s in shapes["batch_shapes"]]
    env = environment()
    key = cache_key(model_identity(model_path, revision), shapes, candidates, env)
    if use_cache and (hit := cached(key)) is not None:
        progress(f"tune: reusing the measurement of {time.strftime('%Y-%m-%d %H:%M', time.localtime(hit.created))}")
        return hit
    if not measure:
        return None

    started = time.monotonic()
    import torch

    with tempfile.TemporaryDirectory(prefix="ortlab-tune-") as tmp:
        work = Path(tmp)
        torch.save(batches, work / "batches.pt")
        logs = log_dir or work
        logs.mkdir(parents=True, exist_ok=True)
        config = {
            "model_path": model_path,
            "task": task,
            "label_names": label_names,
            "revision": revision,
            "learning_rate": learning_rate,
            "weight_decay": weight_decay,
            "seed": seed,
            "batches": str(work / "batches.pt"),
            "warmup": WARMUP_STEPS,
        }
        measured = {c.name: Measured(c.name, c.choice()) for c in candidates}
        live: dict[str, Stepper] = {}
        procs: dict[str, Stepper] = {}
        try:
            to_run = [c for c in candidates if c.skipped is None]
            # All start at once (importing torch and loading the model take most of a candidate's start-up), then
            # warm up one at a time, so each warm-up time is its own.
            progress(f"tune: starting {len(to_run)} candidate processes ({', '.join(c.name for c in to_run)}) ...")
            procs.update({c.name: _candidate_process(c, config, work, logs) for c in to_run})
            loaded = {name: proc.start() is not None for name, proc in procs.items()}
            for i, c in enumerate(to_run, 1):
                m, proc = measured[c.name], procs[c.name]
                reply = None
                if loaded[c.name]:
                    progress(f"tune: warming up {c.name} ({i}/{len(to_run)}) ...")
                    reply = proc.run(WARMUP_STEPS)
                if reply is None:
                    m.verdict = f"failed: {proc.failure()}"
                    continue
                m.warmup_s, m.applied = reply["warmup_s"], reply["applied"]
                missing = [k for k, v in c.choice().items() if v and v != "fp32" and not _applied(m.applied, k, v)]
                if missing:
                    m.verdict = f"rejected: {', '.join(missing)} did not apply ({reply.get('why') or 'see log'})"
                    proc.close()
                    continue
                live[c.name] = proc
                m.slices.append(reply["step_s"])  # a first estimate of the step time, replaced below
            if "plain" not in live:
                raise TuneError(f"tune: the plain mix failed to train: {measured['plain'].verdict}")

            # Interleaved rounds, as many as the budget allows (at least MIN_ROUNDS).
            per_round = sum(measured[n].slices[-1] * SLICE_STEPS for n in live)
            left = budget_s - (time.monotonic() - started)
            rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(left / max(per_round, 1e-6))))
            for m in measured.values():
                m.slices = []
            losses: dict[str, list[float]] = {n: [] for n in live}
            for r in range(rounds):
                progress(f"tune: measuring, round {r + 1}/{rounds} ({', '.join(live)})")
                for name in list(live):
                    reply = live[name].run(SLICE_STEPS)
                    if reply is None:
                        measured[name].verdict = f"failed: {live.pop(name).failure()}"
                        continue
                    measured[name].slices.append(reply["samples"] / sum(reply["times"]))
                    losses[name].extend(reply["losses"])
            for name, proc in live.items():
                done = proc.finish()
                if done:
                    measured[name].peak_mem_mb, measured[name].mem_kind = done["peak_mem_mb"], done["mem_kind"]
        finally:
            for proc in procs.values():
                proc.close()

    if "plain" not in live:
        raise TuneError(f"tune: the plain mix failed while measuring: {measured['plain'].verdict}")
    chosen = _judge(measured, losses, live)
    for c in candidates:
        if c.skipped is not None:
            note = c.skipped if c.skipped.startswith("not measured") else f"not available: {c.skipped}"
            measured[c.name].verdict = note
    result = TuneResult(
        chosen=chosen,
        choice=measured[chosen].choice,
        candidates=[measured[c.name] for c in candidates],
        rounds=rounds,
        slice_steps=SLICE_STEPS,
        calibration_s=time.monotonic() - started,
        key=key,
        environment=env,
        shapes=shapes,
    )
    if use_cache:
        _store(result)
    return result


def _clearly_faster(paired: list[float], alpha: float = SIGN_ALPHA) -> bool:
    """A sign test: faster than plain in so many rounds that a coin (no real difference) would do it rarely."""
    n, wins = len(paired), sum(p > 1 for p in paired)
    tail = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n
    return tail <= alpha


def _applied(applied: dict[str, bool], key: str, value: Any) -> bool:
    name = {"ort": "ort", "fused_adam": "fused_adam", "torch_compile": "torch_compile"}.get(key, value)
    return bool(applied.get(name))


def _judge(measured: dict[str, Measured], losses: dict[str, list[float]], live: dict) -> str:
    """Fill in every verdict; return the chosen candidate's name (plain unless another clearly wins)."""
    plain = measured["plain"]
    plain.samples_per_s = statistics.median(plain.slices)
    plain.ratio, plain.ratio_min, plain.ratio_max = 1.0, 1.0, 1.0
    plain_loss = statistics.fmean(losses["plain"]) if losses["plain"] else None
    plain.loss = plain_loss
    best, best_ratio = "plain", 1.0
    for name in live:
        m = measured[name]
        if len(m.slices) != len(plain.slices):
            m.verdict = m.verdict or "failed: did not finish every round"
            continue
        paired = [a / b for a, b in zip(m.slices, plain.slices, strict=True)]
        m.samples_per_s = statistics.median(m.slices)
        m.ratio, m.ratio_min, m.ratio_max = statistics.median(paired), min(paired), max(paired)
        m.loss = statistics.fmean(losses[name]) if losses[name] else None
        if name == "plain":
            continue
        if m.loss is None or not math.isfinite(m.loss):
            m.verdict = "rejected: the loss is not finite"
        elif plain_loss is not None and abs(m.loss - plain_loss) > LOSS_ATOL + LOSS_RTOL * abs(plain_loss):
            m.verdict = f"rejected: loss {m.loss:.4f} strays from plain's {plain_loss:.4f}"
        elif m.ratio < 1 + WIN_MARGIN or not _clearly_faster(paired):
            wins = sum(p > 1 for p in paired)
            m.verdict = (
                f"slower: {m.ratio:.2f}x plain"
                if m.ratio < 1
                else f"within noise: {m.ratio:.2f}x plain, faster in {wins} of {len(paired)} rounds; plain kept"
            )
        elif m.ratio > best_ratio:
            best, best_ratio = name, m.ratio
    for name in live:
        m = measured[name]
        if name == best:
            m.verdict = "chosen" + (f": {m.ratio:.2f}x plain" if name != "plain" else ": nothing measured faster")
        elif name == "plain":
            m.verdict = f"the baseline ({best} measured faster)"
        elif not m.verdict:
            m.verdict = f"slower than {best}: {m.ratio:.2f}x plain"
    return best


def _candidate_process(candidate: Candidate, config: dict, work: Path, logs: Path) -> Stepper:
    cfg = work / f"{candidate.name}.json"
    cfg.write_text(json.dumps({**config, "candidate": asdict(candidate), "out": str(work / candidate.name)}))
    return Stepper(
        [candidate.python or sys.executable, "-m", "ortlab.tune", str(cfg)], logs / f"tune-{candidate.name}.log"
    )


class Stepper:
    """A training process held between steps and driven line by line (see `slice_callback`).

    `start()` waits until it has loaded; `run(k)` has it train k steps and returns their times and losses;
    `finish()` ends it and returns its peak memory. The benchmark drives its processes with it too.
    """

    def __init__(self, cmd: list[str], log_path: Path):
        self.log_path = log_path
        from ortlab.envvars import child_env

        self._log = open(self.log_path, "w")  # noqa: SIM115 (kept open for the process's lifetime)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=child_env(),
        )
        self._last_error = ""

    def _read(self) -> dict | None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                msg = json.loads(line[len(MARK) :])
                if msg.get("event") == "error":
                    self._last_error = msg["error"]
                    return None
                return msg
        return None

    def _send(self, msg: dict) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def start(self) -> dict | None:
        return self._read()

    def run(self, steps: int) -> dict | None:
        return self._read() if self._send({"run": steps}) else None

    def finish(self) -> dict | None:
        done = self._read() if self._send({"stop": True}) else None
        with contextlib.suppress(subprocess.TimeoutExpired):  # close() kills it
            self.proc.wait(timeout=30)
        return done

    def failure(self) -> str:
        if self._last_error:
            return self._last_error
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            tail = [ln for ln in self.log_path.read_text().splitlines() if ln.strip()]
        except OSError:
            tail = []
        return (tail[-1][:300] if tail else f"exit code {self.proc.returncode}") + f" (log: {self.log_path})"

    def close(self) -> None:
        """Whatever state it is in: its results are in, or it is not wanted any more."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


# --- for a RunSpec ---------------------------------------------------------------------------------------------

BATCHES = WARMUP_STEPS + MAX_ROUNDS * SLICE_STEPS


def batches_from(dataset: Any, collate: Callable, batch_size: int, seed: int, n: int = BATCHES) -> list[dict]:
    """The first `n` batches a seeded shuffle of the run's own training data gives (its real lengths)."""
    import torch

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=collate,
    )
    out: list[dict] = []
    for batch in loader:
        out.append({k: v for k, v in dict(batch).items() if hasattr(v, "shape")})
        if len(out) == n:
            break
    return out


def planned_steps(spec: Any, train_rows: int) -> int:
    h = spec.hyper
    if h.max_steps:
        return h.max_steps
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
) -> tuple[dict[str, Any] | None, TuneResult | None, str]:
    """What the spec's 'auto' fields become in this run: (choice or None for the default, measurement, why)."""
    a = spec.accel
    if not a.auto_fields():
        return None, None, "every acceleration is set explicitly: nothing to decide"
    if spec.target.processes > 1:
        return None, None, "not measured: ortlab tunes single-process runs only; the conservative default applies"
    if spec.adapter.kind != "none":
        # The measurement trains the full model; an adapter run's step (frozen base, a tiny optimizer) is another
        # workload, and a choice measured on the first would be a guess for the second.
        return None, None, "not measured: ortlab tunes full fine-tuning only; adapter runs get the conservative default"
    if a.tune == "off":
        return None, None, "accel.tune is 'off': the conservative default (PyTorch with fused AdamW, fp32)"
    steps = planned_steps(spec, len(train_dataset))
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
        progress=progress,
        log_dir=log_dir,
    )
    if result is None:
        return (
            None,
            None,
            (
                f"not measured ({steps} steps; accel.tune='auto' measures runs of {AUTO_MIN_STEPS}+ steps): the "
                "conservative default (PyTorch with fused AdamW, fp32). `ortlab tune` or accel.tune='measure' "
                "measures which mix is fastest here"
            ),
        )
    how = "a cached measurement" if result.cached else f"measured in {result.calibration_s:.0f} s"
    return result.choice, result, f"{result.chosen} ({how}; table in tune.json)"


def tune_spec(
    spec: Any, progress: Callable[[str], None] = print, use_cache: bool = True, compile: bool = False
) -> TuneResult:
    """`ortlab tune`: check the spec's model and data, then measure its candidate mixes (or reuse the cache)."""
    from ortlab.data import collator, tokenize
    from ortlab.fit import check, fitted
    from ortlab.tasks import load_tokenizer

    model_path, prepared = check(spec, progress)
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
        progress=progress,
    )
    assert result is not None  # measure=True always returns a result or raises
    return result


# --- one candidate (its own process) --------------------------------------------------------------------------


def _say(msg: dict) -> None:
    sys.stdout.write(MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _candidate_main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    c = Candidate(**config["candidate"])
    try:
        trainer = _candidate_trainer(config, c)
        trainer.train()
        return 0
    except Exception as e:  # reported to the driver, which records it as this candidate's verdict
        import traceback

        traceback.print_exc()
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        _say({"event": "error", "error": f"{type(e).__name__}: {text}"[:400]})
        return 1


def _candidate_trainer(config: dict, c: Candidate) -> Any:
    import torch
    from transformers import set_seed

    from ortlab.tasks import TASK_FEATURES, load_model
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

    args = ORTTrainingArguments(
        output_dir=config["out"],
        use_ort=c.ort,
        ort_log_level="ERROR",
        optim="adamw_ort_fused" if c.fused_adam else "adamw_torch",
        fp16=c.precision == "fp16",
        bf16=c.precision == "bf16",
        torch_compile=c.torch_compile,
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
    trainer = ORTTrainer(
        model=model,
        args=args,
        train_dataset=Cycle(),
        data_collator=lambda items: items[0],
        feature=TASK_FEATURES[config["task"]],
    )
    cuda = args.device.type == "cuda"
    warmup = int(config["warmup"])  # the driver's first run command is the warm-up

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

    from ortlab.train.metrics import peak_memory_mb

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


if __name__ == "__main__":
    sys.exit(_candidate_main(sys.argv[1]))
