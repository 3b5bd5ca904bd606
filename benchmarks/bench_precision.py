"""Same training, proven: the demo run in fp32 and in bf16, two seeds each, with what each learned and how fast.

    .venv/bin/python benchmarks/bench_precision.py                 # the embedded default (the demo), seeds 0 and 1
    .venv/bin/python benchmarks/bench_precision.py --smoke --out /tmp/p.json   # a few steps: the machinery (tests)

An acceleration that changes what is learned is not one. For each seed the demo trains twice, fp32 and bf16, in
ABBA order over the seeds (fp32 bf16, bf16 fp32) so a machine that gets busier slows both precisions alike, each
run a real `ortlab train` in its own process. Reported per pair: the eval accuracy and loss after training (the
difference between precisions against the difference between seeds: the noise), the largest gap between the two
loss curves over the first steps (against the tolerance ortlab uses to switch bf16 on by itself), the steady
samples/s ratio, and each run's MFU against this machine's measured matmul peak of its precision (`ortlab.peak`).

Results go to benchmarks/results/precision-<date>.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import cpu_name, train_demo, write_report  # noqa: E402

CURVE_STEPS = 20  # the loss curves are compared over the first this many steps


def train(precision: str, seed: int, out: Path, extra: list[str]) -> dict:
    """One `ortlab train` of the demo in its own process; its result.json and step losses."""
    result, records, wall_s = train_demo(
        f"{precision}-seed{seed}", ["--precision", precision, "--seed", str(seed), *extra], out
    )
    begin = next(r for r in records if r.get("event") == "train_begin")
    losses = [r["loss"] for r in records if r.get("event") == "step"]
    scores = result["eval_after"]
    summary = result["summary"]
    return {
        "precision": precision,
        "seed": seed,
        "eval_accuracy": scores.get("eval_accuracy"),
        "eval_loss": scores.get("eval_loss"),
        "losses": losses,
        "steady_samples_per_s": summary.get("steady_samples_per_s"),
        "steady_mfu": summary.get("steady_mfu"),
        "peak": begin["device"]["mfu"],
        "bf16_applied": result["accelerations"]["bf16"]["applied"],
        "wall_s": wall_s,
    }


def compare(fp32: dict, bf16: dict) -> dict:
    from ortlab.tune.judge import LOSS_ATOL, LOSS_RTOL

    n = min(CURVE_STEPS, len(fp32["losses"]), len(bf16["losses"]))
    gaps = [abs(a - b) for a, b in zip(fp32["losses"][:n], bf16["losses"][:n], strict=True)]
    allowed = [LOSS_ATOL + LOSS_RTOL * abs(a) for a in fp32["losses"][:n]]
    return {
        "seed": fp32["seed"],
        "accuracy_fp32": fp32["eval_accuracy"],
        "accuracy_bf16": bf16["eval_accuracy"],
        "accuracy_diff": bf16["eval_accuracy"] - fp32["eval_accuracy"],
        "eval_loss_diff": bf16["eval_loss"] - fp32["eval_loss"],
        "curve_steps": n,
        "curve_max_gap": max(gaps) if gaps else None,
        "curve_within_tolerance": all(g <= a for g, a in zip(gaps, allowed, strict=True)),
        "samples_per_s_ratio_bf16_over_fp32": bf16["steady_samples_per_s"] / fp32["steady_samples_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few rows: checks the machinery")
    parser.add_argument("--out", type=Path, help="the JSON to write (default: benchmarks/results/)")
    opts = parser.parse_args(argv)
    extra = ["--max-steps", "4", "--max-train-samples", "64", "--max-eval-samples", "32"] if opts.smoke else []
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-precision-") as tmp:
        for i, seed in enumerate(opts.seeds):
            order = ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")
            for precision in order:
                print(f"[bench-precision] seed {seed}: {precision} ...", flush=True)
                runs.append(train(precision, seed, Path(tmp), extra))
    pairs = []
    for seed in opts.seeds:
        by = {r["precision"]: r for r in runs if r["seed"] == seed}
        pairs.append(compare(by["fp32"], by["bf16"]))
    fp32_acc = [r["eval_accuracy"] for r in runs if r["precision"] == "fp32"]
    report = {
        "benchmark": "precision",
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "smoke": opts.smoke,
        "method": "the demo (`ortlab train` defaults) per seed in fp32 and bf16, ABBA order; eval after training; "
        f"loss curves over the first {CURVE_STEPS} steps against LOSS_ATOL + LOSS_RTOL*|fp32|",
        "seed_noise_accuracy_fp32": max(fp32_acc) - min(fp32_acc) if len(fp32_acc) > 1 else None,
        "pairs": pairs,
        "runs": runs,
    }
    path = write_report(report, opts.out, f"precision-{date.today().isoformat()}.json")
    for p in pairs:
        print(
            f"seed {p['seed']}: accuracy fp32 {p['accuracy_fp32']:.3f} bf16 {p['accuracy_bf16']:.3f}; curve gap "
            f"{p['curve_max_gap']:.4f} ({'within' if p['curve_within_tolerance'] else 'OUTSIDE'} tolerance); "
            f"bf16 {p['samples_per_s_ratio_bf16_over_fp32']:.2f}x fp32 samples/s"
        )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
