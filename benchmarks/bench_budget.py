"""Runs fitted to a budget (`budget.minutes`): how close each run's wall time came to what it was given.

    .venv/bin/python benchmarks/bench_budget.py              # three specs, each run twice (~15 min here)
    .venv/bin/python benchmarks/bench_budget.py --smoke --out /tmp/b.json   # one tiny case, once (the machinery)

Each case is a real `ortlab train` in its own process with `--budget-minutes`: the launch fits max_steps from the
estimate, the run ends its training in time should it go slower. Each case runs twice: first with this machine's
estimator calibration set aside (what a first run here gets; a looser budget, see CASES), then with its budget and
what the first run taught the estimator (the precision 'auto' chose, the efficiency, the startup). The calibration
file is put back afterwards.

Reported per run: the budget, the run's wall time (result.json's `wall_time_s`, the clock the budget is held to),
their ratio, what the launch chose (`budget.fitted`), whether the run ended its training early, and the estimate's
own errors. Goal (issue #45): within 10 % of the budget. Results go to benchmarks/results/budget-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import machine_record, write_report  # noqa: E402

# name: (spec, budget in minutes, the first run's budget). The budgets bind: each is shorter than the run would
# take without one (the default MiniLM run takes ~40 s here, the SmolLM2 one an epoch of 500 steps). The first run
# of each case, with nothing learned here yet, gets a looser budget: the uncalibrated estimate (fp32 for 'auto', a
# default efficiency) can find no step fits the tight one, and a refused run teaches nothing.
CASES = {
    "minilm-default-0.5min": ({}, 0.5, 2.0),
    "minilm-b32-l64-0.5min": ({"hyper": {"batch_size": 32, "max_length": 64}}, 0.5, 2.0),
    "smollm2-lora-chat-3min": (
        {
            "task": "causal-lm",
            "model": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct"},
            "data": {"source": "embedded:rotten-tomatoes-chat", "max_train_samples": 2000, "max_eval_samples": 32},
            "hyper": {"batch_size": 4, "max_length": 96, "eval_batch_size": 8},
            "generation": {"num_prompts": 0},
            "adapter": {"kind": "lora"},
        },
        3.0,
        3.0,
    ),
}
SMOKE = {"tiny-2min": ({"data": {"max_train_samples": 400, "max_eval_samples": 32}}, 2.0, 2.0)}


def run_case(name: str, spec: dict, minutes: float, folder: Path, attempt: int, timeout_s: float) -> dict:
    path = folder / f"{name}-{attempt}.json"
    path.write_text(json.dumps({**spec, "name": f"{name}-{attempt}", "output_dir": str(folder / "runs")}))
    cli = Path(sys.executable).parent / "ortlab"
    started = time.monotonic()
    out = subprocess.run(
        [str(cli), "train", str(path), "--budget-minutes", str(minutes)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "100"},
    )
    seconds = time.monotonic() - started
    result_file = folder / "runs" / f"{name}-{attempt}" / "result.json"
    if out.returncode != 0 or not result_file.is_file():
        return {"error": (out.stderr or out.stdout)[-1500:], "seconds": seconds}
    result = json.loads(result_file.read_text())
    budget_s = 60 * minutes
    estimate = result.get("estimate") or {}
    return {
        "budget_s": budget_s,
        "wall_time_s": result["wall_time_s"],
        "ratio": result["wall_time_s"] / budget_s,
        "process_seconds": seconds,  # the whole command: the preflight's checks and the imports too
        "fitted": result["budget"]["fitted"],
        "ended_early_at_step": result["budget"]["ended_early_at_step"],
        "steps": result["summary"]["steps"],
        "precision": estimate.get("precision"),
        "step_time": estimate.get("step_time_s"),
        "total_time": estimate.get("total_time_s"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out")
    p.add_argument("--only", nargs="*")
    opts = p.parse_args()
    cases = SMOKE if opts.smoke else {k: v for k, v in CASES.items() if not opts.only or k in opts.only}
    attempts = 1 if opts.smoke else 2
    from ortlab.envvars import cache_dir

    calib = cache_dir() / "estimate" / "calibration.json"
    kept = calib.read_bytes() if calib.is_file() else None
    rows: dict[str, list[dict]] = {}
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
            for name, (spec, minutes, first) in cases.items():
                calib.unlink(missing_ok=True)  # the first run of each case: nothing learned here yet
                for attempt in (1, 2)[:attempts]:
                    given = first if attempt == 1 else minutes
                    print(f"[budget] {name} run {attempt}: {given:g} min ...", flush=True)
                    row = run_case(name, spec, given, Path(tmp), attempt, 60 * given * 3 + 300)
                    rows.setdefault(name, []).append(row)
                    said = (
                        row.get("error") or f"{row['wall_time_s']:.0f} s of {row['budget_s']:.0f} ({row['ratio']:.2f})"
                    )
                    print(f"[budget]   {said}", flush=True)
                shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
    finally:
        if kept is not None:
            calib.parent.mkdir(parents=True, exist_ok=True)
            calib.write_bytes(kept)
        else:
            calib.unlink(missing_ok=True)
    ratios = [r["ratio"] for runs in rows.values() for r in runs[1:] or runs if "ratio" in r]
    report = {
        "date": date.today().isoformat(),
        "machine": machine_record(load_before),
        "what": "runs fitted to budget.minutes: wall time against the budget, cold and then calibrated",
        "goal": "within 10 % of the budget",
        "calibrated_within_10pct": sum(abs(x - 1) <= 0.10 for x in ratios),
        "calibrated_runs": len(ratios),
        "cases": {
            name: {"minutes": cases[name][1], "first_minutes": cases[name][2], "spec": cases[name][0], "runs": runs}
            for name, runs in rows.items()
        },
    }
    path = write_report(report, opts.out, ("smoke-" if opts.smoke else "") + f"budget-{date.today().isoformat()}.json")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
