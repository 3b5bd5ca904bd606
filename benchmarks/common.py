"""The measuring loop every throughput benchmark here shares: start, warm up, interleaved rounds, paired ratios.

Why interleaving: on a shared machine one run of a mix after another measured the same plain Trainer at 10.3 and
11.7 samples/s, so no ratio under ~15 % could be read from runs in sequence. Here every row trains in its own
process (driven by `ortlab.tune.Stepper`; the row scripts time their steps with `ortlab.tune.slice_callback`),
all processes start at once and warm up one at a time (warm-up, ORT's export, torch.compile's compilation are
reported apart), and then they train in slices, round by round, in a shuffled order (no row always runs right
after another). A busy machine's drift then hits both sides of a pair alike: each row's slice is compared with
the baseline's slice *of the same round* (a paired ratio), and the median of those ratios is the steady-state
ratio, with a bootstrap 95 % interval. A second, identical baseline process gives the noise floor.

Stdlib only (the row processes import torch; the driver needs not).
"""

from __future__ import annotations

import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortlab.tune import Stepper


def interleave(
    procs: dict[str, Stepper],
    results: dict[str, dict],
    *,
    warmup: int,
    rounds: int,
    slice_steps: int,
    tag: str = "[bench]",
    baseline: str | None = None,
    baseline_what: str = "the baseline",
    warmup_key: str = "warmup_time_s",
    keep_losses: bool = False,
    keep_memory: bool = True,
    on_round: Callable[[int, dict[str, Stepper]], None] | None = None,
) -> float:
    """Drive the row processes `procs` (started, not yet loaded) through warm-up and `rounds` interleaved rounds;
    returns the seconds the rounds took. Every process is closed on the way out, whatever happens.

    Into `results[name]` (one dict per row, made by the caller) go: `error` (why a row failed: it leaves the
    rounds, the others go on), `<warmup_key>` and `applied` from the warm-up, `slices` (samples/s of each round's
    slice), with `keep_losses` the slices' `losses`, with `keep_memory` `peak_mem_mb` and `mem_kind`. A row named
    `baseline` that fails before the rounds ends the benchmark (every ratio is to it). `on_round(r, live)` runs
    after each round (default: a progress line).
    """
    try:
        for name, proc in procs.items():
            if proc.start() is None:
                results[name]["error"] = proc.failure()
        live: dict[str, Stepper] = {}
        for name, proc in procs.items():
            if "error" in results[name]:
                continue
            print(f"{tag} warming up {name} ...", flush=True)
            reply = proc.run(warmup)
            if reply is None:
                results[name]["error"] = proc.failure()
                print(f"{tag} {name} failed: {results[name]['error']}", file=sys.stderr, flush=True)
                continue
            results[name].update({warmup_key: reply["warmup_s"], "applied": reply["applied"], "slices": []})
            if keep_losses:
                results[name]["losses"] = []
            live[name] = proc
        if baseline is not None and baseline not in live:
            raise SystemExit(f"{baseline_what} failed: {results[baseline].get('error')}")
        started = time.monotonic()
        for r in range(rounds):
            order = list(live)
            random.Random(r).shuffle(order)  # seeded: reruns interleave alike
            for name in order:
                reply = live[name].run(slice_steps)
                if reply is None:
                    results[name]["error"] = live.pop(name).failure()
                    continue
                results[name]["slices"].append(reply["samples"] / sum(reply["times"]))
                if keep_losses:
                    results[name]["losses"].extend(reply["losses"])
            if on_round is not None:
                on_round(r, live)
            else:
                print(f"{tag} round {r + 1}/{rounds}", flush=True)
        elapsed = time.monotonic() - started
        for name, proc in live.items():
            done = proc.finish()
            if done and keep_memory:
                results[name].update(peak_mem_mb=done["peak_mem_mb"], mem_kind=done["mem_kind"])
        return elapsed
    finally:
        for proc in procs.values():
            proc.close()


def bootstrap_ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % interval for the median of `values` (resampled with a fixed seed, so reruns agree)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def analyze(
    results: dict[str, dict],
    baseline: str = "baseline",
    ratios: dict[str, str] | None = None,
) -> list[float] | None:
    """Ratios of every row to `baseline` (the plain Trainer here); returns the noise floor (the 95 % interval of
    `baseline@2` / `baseline`), or None without a second baseline process.

    The reference of each round is the geometric mean of the two baseline processes' slices: one process can
    run a few percent slower than an identical one for its whole life (where its memory and threads landed), and
    two baselines halve that bias. The noise floor compares the two with each other. `ratios` maps a row field to
    the name of its ratio to the baseline's (default: peak memory).
    """
    a, b = results[baseline], results.get(f"{baseline}@2", {"error": "not run"})
    both = "error" not in b and len(b.get("slices", [])) == len(a["slices"])
    reference = [math.sqrt(x * y) for x, y in zip(a["slices"], b["slices"], strict=True)] if both else a["slices"]
    for r in results.values():
        if "error" in r or len(r.get("slices", [])) != len(reference):
            r.setdefault("error", "did not finish every round")
            continue
        paired = [x / y for x, y in zip(r["slices"], reference, strict=True)]
        r["samples_per_s"] = statistics.median(r["slices"])
        r["throughput_ratio"] = statistics.median(paired)
        r["ratio_ci95"] = list(bootstrap_ci(paired))
        for field, name in (ratios or {"peak_mem_mb": "peak_mem_ratio"}).items():
            if r.get(field) and a.get(field):
                r[name] = r[field] / a[field]
    if not both:
        return None
    return list(bootstrap_ci([y / x for x, y in zip(a["slices"], b["slices"], strict=True)]))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_record(load_before: tuple[float, float, float]) -> dict:
    """The machine a benchmark ran on, with the load average at its start and end (a shared machine's noise)."""
    import os

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()}


def train_demo(name: str, flags: list[str], out: Path) -> tuple[dict, list[dict], float]:
    """One `ortlab train` (the demo, changed by `flags`) as a user runs it, in its own process, into `out/name`:
    its result.json, its metrics records and its wall time. Exits naming the run when it failed."""
    import json
    import os
    import subprocess

    cmd = [str(Path(sys.executable).parent / "ortlab"), "train", "--output-dir", str(out), "--name", name, "--quiet"]
    started = time.monotonic()
    proc = subprocess.run([*cmd, *flags], capture_output=True, text=True, env=dict(os.environ, COLUMNS="120"))
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run = out / name
    result = json.loads((run / "result.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return result, records, time.monotonic() - started


def write_report(report: dict, output: str | Path | None, name: str) -> Path:
    """Write a benchmark's JSON to `output`, or to benchmarks/results/`name` when none is given; return the path."""
    import json

    path = Path(output) if output else Path(__file__).resolve().parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return path


# --- the TRL comparisons (bench_lora_trl, bench_dpo_trl): trl from a folder of its own, never ortlab's environment


def check_trl_site(site: str | None, script: str, install: str) -> str:
    """The folder trl was installed into, checked before anything trains: a clear error naming the package and the
    command (`install`, which fills the folder) if it holds no trl. `script` is the benchmark, for the message."""
    if not site or not (Path(site) / "trl" / "__init__.py").is_file():
        where = f"{site!r} has no trl package" if site else "no --trl-site given"
        target = install.split("--target ", 1)[1].split(" ", 1)[0] if "--target " in install else "DIR"
        raise SystemExit(
            f"{script}: trl is needed for the TRL rows and is not part of ortlab's environment ({where}). "
            f"Install it into a folder of its own and name it:\n    {install}\n    "
            f".venv/bin/python benchmarks/{script}.py --trl-site {target}"
        )
    return str(Path(site).resolve())


def trl_row_inputs(site: str, model: str, data_file: str) -> tuple[Any, Any, Any, Any]:
    """In a TRL row's own process (bench_lora_trl, bench_dpo_trl): trl from its folder, put on this process's path
    only (the ortlab row and the driver never import trl), and the job's model, tokenizer and JSONL rows, the
    embedded copy of the model that ortlab's row loads too (made by the driver beforehand). Returns (trl, tokenizer,
    model, dataset)."""
    sys.path.insert(0, site)
    import trl
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ortlab.tasks import resolve_model

    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    return trl, tokenizer, loaded, load_dataset("json", data_files=data_file, split="train")


def trl_version(site: str) -> str | None:
    """trl's version from its installed metadata in `site` (read, not imported: the driver stays clean)."""
    for meta in Path(site).glob("trl-*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def print_ratio_table(report: dict, unit: str = "examples/s", baseline: str = "trl") -> None:
    """Each row's rate, its paired ratio to `baseline` with the interval, its peak memory and that ratio."""
    head = ("row", unit, f"vs {baseline}", "95% CI", "peak MB", f"vs {baseline}")
    print("\n{:<11} {:>11} {:>7} {:>12} {:>8} {:>8}".format(*head))
    for r in report["results"]:
        if "error" in r:
            print(f"{r['mix']:<11} failed: {str(r['error'])[:100]}")
            continue
        ci = "{:.2f}-{:.2f}".format(*r["ratio_ci95"])
        print(
            f"{r['mix']:<11} {r['samples_per_s']:>11.2f} {r['throughput_ratio']:>7.2f} {ci:>12} "
            f"{r.get('peak_mem_mb', 0):>8.0f} {r.get('peak_mem_ratio', 0):>8.2f}"
        )
