"""How to measure: the driver that trains every candidate mix in its own process and times them interleaved.

- each candidate mix trains in its own process (ORTModule and DeepSpeed keep global state; peak memory must
  be per candidate), on the same saved batches of the run's own data, from the same seed;
- each process warms up (ORT's export, graph build, allocator) and reports that time apart, then waits;
- the driver then runs the candidates in interleaved slices (A B C A B C ...), so a busy machine slows every
  candidate alike, and `ortlab.tune.judge` compares each slice with the plain slice next to it (a paired ratio).

`Stepper` is the driver's end of a candidate process (`ortlab.tune.child` is the other end); the benchmarks
drive their processes with it too. A candidate's stderr goes to a log file next to the measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ortlab.accel.mix import _cuda_available
from ortlab.accel.tcmalloc import process_env
from ortlab.envvars import child_cwd, child_env
from ortlab.tune import share
from ortlab.tune.child import MARK
from ortlab.tune.judge import _applied, _judge
from ortlab.tune.mixes import MixCandidate, bf16_skipped, candidate_mixes
from ortlab.tune.result import Measured, TuneError, TuneResult
from ortlab.tune.resultcache import cache_key, cached, measurement_environment, model_identity, store_result

WARMUP_STEPS = 2  # step 1 holds ORT's export and graph build; step 2 settles the allocator
SLICE_STEPS = 1  # steps per interleaved slice: one batch, the same batch for every candidate in a round
MIN_ROUNDS, MAX_ROUNDS = 4, 12
DEFAULT_BUDGET_S = 60.0


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
    baselines: bool = False,
    tcmalloc: bool = False,
    progress: Callable[[str], None] = print,
    log_dir: Path | None = None,
) -> TuneResult | None:
    """Measure the candidate mixes on `batches` (collated batches of the run's own data) and pick the fastest.

    With `measure=False` only a cached measurement is returned (None when there is none). With `baselines`, plain
    `transformers.Trainer` in fp32 and with bf16=True train in the same rounds (never chosen), and each row gets its
    ratio to both and its share of the measured peak (`ortlab.tune.share`; what `ortlab tune` shows). `tcmalloc`:
    the candidates start with it, as the run would (`ortlab.accel.tcmalloc`); the references never do (a plain
    Trainer is what a user runs without ortlab).
    """
    candidates = candidate_mixes(processes, compile=compile)
    cuda = _cuda_available()
    refs = share.references(bf16_skipped(cuda)) if baselines else []
    shapes = {
        "task": task,
        "batch_shapes": sorted({tuple(b["input_ids"].shape) for b in batches}),
        "labels": len(label_names or []),
    }
    shapes["batch_shapes"] = [list(s) for s in shapes["batch_shapes"]]
    env = {**measurement_environment(), "tcmalloc": tcmalloc}  # (a measurement under one allocator is not the other's)
    key = cache_key(model_identity(model_path, revision), shapes, candidates, env)
    hit = cached(key) if use_cache else None
    if hit is not None and (hit.references or not baselines):  # one without the references is measured again
        progress(f"tune: reusing the measurement of {time.strftime('%Y-%m-%d %H:%M', time.localtime(hit.created))}")
        return hit
    if not measure:
        return None

    started = time.monotonic()
    import torch

    peaks, flops = {}, None
    if baselines:  # before any candidate starts: a peak is measured with nothing else of ours running
        precisions = {c.precision for c in [*candidates, *refs] if c.skipped is None}
        progress(f"tune: the measured matmul peak ({', '.join(sorted(precisions))}) ...")
        peaks = share.measured_peaks(precisions, "cuda" if cuda else "cpu")
        flops = share.mean_flops_per_sample(model_path, task, label_names, revision, batches)

    with tempfile.TemporaryDirectory(prefix="ortlab-tune-") as tmp:
        work = Path(tmp)
        torch.save(batches, work / "batches.pt")
        logs = log_dir or work
        logs.mkdir(parents=True, exist_ok=True)
        config = {
            # The candidates run in ortlab's folder (`child_cwd`): a local model folder is named in full.
            "model_path": os.path.abspath(model_path) if os.path.isdir(model_path) else model_path,
            "task": task,
            "label_names": label_names,
            "revision": revision,
            "learning_rate": learning_rate,
            "weight_decay": weight_decay,
            "seed": seed,
            "batches": str(work / "batches.pt"),
            "warmup": WARMUP_STEPS,
        }
        measured = {c.name: Measured(c.name, c.choice()) for c in [*candidates, *refs]}
        live: dict[str, Stepper] = {}
        procs: dict[str, Stepper] = {}
        try:
            to_run = [c for c in [*candidates, *refs] if c.skipped is None]
            # All start at once (importing torch and loading the model take most of a candidate's start-up), then
            # warm up one at a time, so each warm-up time is its own.
            progress(f"tune: starting {len(to_run)} candidate processes ({', '.join(c.name for c in to_run)}) ...")
            procs.update({c.name: _candidate_process(c, config, work, logs, tcmalloc) for c in to_run})
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
                if missing and not c.reference:
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
    ref_names = {c.name for c in refs}
    chosen = _judge(measured, losses, {n: p for n, p in live.items() if n not in ref_names})
    for c in [*candidates, *refs]:
        if c.skipped is not None:
            note = c.skipped if c.skipped.startswith("not measured") else f"not available: {c.skipped}"
            measured[c.name].verdict = note
    for name in ref_names:
        m = measured[name]
        if m.slices and len(m.slices) == len(measured["plain"].slices):
            m.samples_per_s = statistics.median(m.slices)
            m.ratio = statistics.median(a / b for a, b in zip(m.slices, measured["plain"].slices, strict=True))
            m.verdict = share.reference_verdict(name)
    rows = list(measured.values())
    share.add_reference_ratios(rows, {n: measured[n] for n in ref_names})
    share.add_peak_share(rows, flops, peaks)
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
        references=[measured[c.name] for c in refs],
        peaks=peaks,
        flops_per_sample=flops,
    )
    if use_cache:
        store_result(result)
    return result


def _candidate_process(candidate: MixCandidate, config: dict, work: Path, logs: Path, tcmalloc: bool) -> Stepper:
    cfg = work / f"{candidate.name}.json"
    cfg.write_text(json.dumps({**config, "candidate": asdict(candidate), "out": str(work / candidate.name)}))
    return Stepper(
        [candidate.python or sys.executable, "-m", "ortlab.tune", str(cfg)],
        logs / f"tune-{candidate.name}.log",
        env=process_env(child_env(), on=tcmalloc and not candidate.reference),
    )


class Stepper:
    """A training process held between steps and driven line by line (see `slice_callback`).

    `start()` waits until it has loaded; `run(k)` has it train k steps and returns their times and losses;
    `finish()` ends it and returns its peak memory. The benchmark drives its processes with it too.
    """

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._log = open(self.log_path, "w")  # noqa: SIM115 (kept open for the process's lifetime)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=child_env() if env is None else env,
            cwd=child_cwd(),  # (and a safe path, `child_env`): nothing imported from the caller's folder
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
