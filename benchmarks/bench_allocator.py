"""The allocator on the demo: `ortlab train` with tcmalloc (its default where installed) against glibc's malloc.

    .venv/bin/python benchmarks/bench_allocator.py                    # the demo, 3 rounds (6 runs, ~6 min here)
    .venv/bin/python benchmarks/bench_allocator.py --smoke --out /tmp/a.json   # a few steps: the machinery (tests)

Each round trains the demo twice, each a real `ortlab train` in its own process, once with `--tcmalloc` (the process
starts itself again with the library preloaded) and once with `--no-tcmalloc`, in ABBA order over the rounds so a
machine that gets busier slows both alike. Reported: per pair the steady samples/s ratio and the peak memory ratio
(tcmalloc over glibc), their medians, each run's MFU against this machine's measured matmul peak, and whether the
two trained the same: the step losses and the eval scores compared to every digit (an allocator decides where
memory is, never what is computed).

Results go to benchmarks/results/allocator-<date>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import cpu_name, train_demo, write_report  # noqa: E402

ARMS = {"tcmalloc": "--tcmalloc", "glibc": "--no-tcmalloc"}


def train(arm: str, round_: int, out: Path, extra: list[str]) -> dict:
    result, records, wall_s = train_demo(f"{arm}-{round_}", [ARMS[arm], *extra], out)
    summary = result["summary"]
    record = result["accelerations"]["tcmalloc"]
    return {
        "arm": arm,
        "round": round_,
        "tcmalloc_applied": record["applied"],
        "library": record["details"].get("library"),
        "losses": [r["loss"] for r in records if r.get("event") == "step"],
        "eval_after": result["eval_after"],
        "steady_samples_per_s": summary.get("steady_samples_per_s"),
        "peak_mem_mb": summary.get("peak_mem_mb"),
        "steady_mfu": summary.get("steady_mfu"),
        "wall_s": wall_s,
    }


def compare(on: dict, off: dict) -> dict:
    scores = [k for k in on["eval_after"] if k.startswith("eval_") and "time" not in k and "per_second" not in k]
    return {
        "round": on["round"],
        "samples_per_s_ratio": on["steady_samples_per_s"] / off["steady_samples_per_s"],
        "peak_mem_ratio": on["peak_mem_mb"] / off["peak_mem_mb"],
        "same_losses": on["losses"] == off["losses"],
        "max_loss_gap": max((abs(a - b) for a, b in zip(on["losses"], off["losses"], strict=False)), default=None),
        "same_eval": all(on["eval_after"][k] == off["eval_after"].get(k) for k in scores),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one round of a few steps: checks the machinery")
    parser.add_argument("--out", type=Path, help="the JSON to write (default: benchmarks/results/)")
    parser.add_argument("--note", default=None, help="written into the result, e.g. what else ran on the machine")
    opts = parser.parse_args(argv)
    from ortlab.accel import tcmalloc

    if tcmalloc.find() is None:
        raise SystemExit(f"{tcmalloc.LIBRARY} is not installed here: {tcmalloc.REMEDY}")
    extra = ["--max-steps", "4", "--max-train-samples", "64", "--max-eval-samples", "32"] if opts.smoke else []
    rounds = 1 if opts.smoke else opts.rounds
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-allocator-") as tmp:
        for i in range(rounds):
            for arm in ("tcmalloc", "glibc") if i % 2 == 0 else ("glibc", "tcmalloc"):
                print(f"[bench-allocator] round {i + 1}/{rounds}: {arm} ...", flush=True)
                runs.append(train(arm, i, Path(tmp), extra))
    by = {(r["round"], r["arm"]): r for r in runs}
    pairs = [compare(by[i, "tcmalloc"], by[i, "glibc"]) for i in range(rounds)]
    report = {
        "benchmark": "allocator",
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "smoke": opts.smoke,
        "note": opts.note,
        "method": "the demo (`ortlab train` defaults) with --tcmalloc and --no-tcmalloc per round, ABBA order; "
        "steady samples/s and peak memory (VmHWM) per run, paired ratios tcmalloc over glibc, medians",
        "samples_per_s_ratio_median": statistics.median(p["samples_per_s_ratio"] for p in pairs),
        "peak_mem_ratio_median": statistics.median(p["peak_mem_ratio"] for p in pairs),
        "same_training": all(p["same_losses"] and p["same_eval"] for p in pairs),
        "pairs": pairs,
        "runs": runs,
    }
    path = write_report(report, opts.out, f"allocator-{date.today().isoformat()}.json")
    for p in pairs:
        print(
            f"round {p['round'] + 1}: tcmalloc {p['samples_per_s_ratio']:.3f}x glibc samples/s, "
            f"{p['peak_mem_ratio']:.3f}x peak memory; same losses {p['same_losses']}, same eval {p['same_eval']}"
        )
    print(
        f"median: {report['samples_per_s_ratio_median']:.3f}x samples/s, {report['peak_mem_ratio_median']:.3f}x "
        f"memory; the same training: {report['same_training']}\nwritten to {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
