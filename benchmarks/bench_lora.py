"""LoRA against full fine-tuning of a SmolLM2-135M-shaped causal LM: throughput, peak memory, trainable parameters
and optimizer state, as ratios to full fine-tuning measured in the same script.

    .venv/bin/python benchmarks/bench_lora.py                          # CPU, SmolLM2-135M shapes, seq 256
    .venv/bin/python benchmarks/bench_lora.py --device cuda --batch-size 16 --rounds 20
    .venv/bin/python benchmarks/bench_lora.py --smoke                  # a tiny Llama, seconds (CI)

The model is built from SmolLM2-135M's configuration (30 layers, hidden 576, intermediate 1536, 9 heads, 3 KV
heads, vocabulary 49152, tied embeddings) with random weights: the same shapes and FLOPs as the real model, no
download. Token ids are random (throughput depends on shapes, not on which tokens).

Method (as bench_trainer's): every row trains in its own process (ORTModule keeps global state; peak memory is
per process); all are warmed up first (warm-up reported apart), then they train in interleaved slices of
`--slice` steps for `--rounds` rounds in a shuffled order. Each row's slice is compared with the full
fine-tuning slices of the same round (the geometric mean of two identical full-fine-tuning processes), so a machine
that gets busier slows both sides of a pair; the second full process over the first is the noise floor. Ratios are
medians of the paired ratios with a bootstrap 95 % interval.

Rows: full fine-tuning (twice), LoRA (rank 8 on q/k/v/o), and LoRA under ORTModule (fallback disabled) when ORT
is available here. Every row runs through ORTTrainer with AdamW (not fused), fp32 on CPU, bf16 on CUDA.
Results go to benchmarks/results/lora-<device>-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import analyze, cpu_name, interleave, write_report  # noqa: E402

# SmolLM2-135M's configuration (HuggingFaceTB/SmolLM2-135M config.json), the fields that decide shapes and FLOPs.
SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000,
}
SMOKE = {**SMOLLM2_135M, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
SMOKE.update(num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
METHOD = (
    "interleaved slices in shuffled order; each row's slice over the geometric mean of the two full-fine-tuning "
    "processes' slices of the same round; medians with bootstrap 95% intervals; noise floor = full@2 over full"
)


def causal_tokens(vocab: int, seq_len: int):
    """A seeded endless dataset of random token rows, labels = inputs (the model shifts them)."""
    import torch

    class Random(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict:
            g = torch.Generator().manual_seed(i % 997)
            ids = torch.randint(3, vocab, (seq_len,), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(seq_len, dtype=torch.long), "labels": ids.clone()}

    return Random()


# --- one row (its own process) ---------------------------------------------------------------------------------


def child(opts: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import AdapterSpec, RunSpec
    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.trainer import ORTTrainer
    from ortlab.tune import slice_callback

    torch.manual_seed(0)
    config = LlamaConfig(**(SMOKE if opts.smoke else SMOLLM2_135M), use_cache=False)
    model = LlamaForCausalLM(config)
    parts = set(opts.mix.partition("@")[0].split("+"))
    if "lora" in parts:
        from ortlab.adapters import apply_lora

        model = apply_lora(model, AdapterSpec(kind="lora", rank=8, alpha=16, dropout=0.0), "causal-lm")
    cuda = opts.device == "cuda"
    run = RunDir.create(opts.out, RunSpec(name="bench", accel={"ort": False, "fused_adam": False}))
    args = ORTTrainingArguments(
        output_dir=opts.out,
        metrics_path=str(run.metrics_path),  # the parameters record (trainable, optimizer state) is read from it
        use_ort="ort" in parts,
        ort_fallback="error",
        ort_log_level="ERROR",
        optim="adamw_torch",
        bf16=cuda,
        per_device_train_batch_size=opts.batch_size,
        max_steps=10**6,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not cuda,
        seed=0,
    )
    trainer = ORTTrainer(model=model, args=args, train_dataset=causal_tokens(config.vocab_size, opts.seq_len))
    step = lambda: (trainer._step_counters["loss"], trainer._step_counters["samples"])  # noqa: E731

    def applied():
        return {k: v.applied for k, v in trainer.accelerations.items() if v.requested}, None

    trainer.add_callback(slice_callback(cuda, opts.warmup, step, applied))
    trainer.train()


# --- the driver ----------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each row trains --slice steps)")
    p.add_argument("--slice", type=int, default=1, help="steps per row per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-ort", action="store_true", help="leave out the LoRA + ORTModule row")
    p.add_argument(
        "--smoke", action="store_true", help="a tiny Llama, two rows, few steps: checks the script, not speed"
    )
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/lora-<device>-<date>.json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        child(opts)
        return
    if opts.smoke:
        opts.seq_len, opts.rounds, opts.warmup = min(opts.seq_len, 32), min(opts.rounds, 2), 1

    from ortlab.accel import ort, package_version
    from ortlab.tune import Stepper

    # The smoke run checks the script (two processes, no ORT export): no noise floor, no ORT row.
    rows = ["full", "lora"] if opts.smoke else ["full", "full@2", "lora"]
    ort_check = ort.availability()
    if not opts.no_ort and not opts.smoke and ort_check.available:
        rows.append("lora+ort")
    print(f"[bench] {len(rows)} processes: {', '.join(rows)}", flush=True)
    results: dict[str, dict] = {name: {"mix": name} for name in rows}
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-lora-") as tmp:
        procs, outs = {}, {}
        for name in rows:
            out = f"{tmp}/{name.replace('@', '-').replace('+', '-')}"
            cmd = [sys.executable, __file__, "--child", "--mix", name, "--out", out]
            for key in ("device", "batch_size", "seq_len", "warmup"):
                cmd += [f"--{key.replace('_', '-')}", str(getattr(opts, key))]
            cmd += ["--smoke"] if opts.smoke else []
            procs[name] = Stepper(cmd, Path(f"{out}.log"))
            outs[name] = Path(out)
        measure_time = interleave(
            procs,
            results,
            warmup=opts.warmup,
            rounds=opts.rounds,
            slice_steps=opts.slice,
            baseline="full",
            baseline_what="the full fine-tuning row",
        )
        for name, out in outs.items():
            results[name].update(_parameters(out))

    # Ratios to full fine-tuning, against the geometric mean of its two processes (bench_trainer's method).
    noise = analyze(
        results,
        baseline="full",
        ratios={"peak_mem_mb": "peak_mem_ratio", "optimizer_state_bytes": "optimizer_state_ratio"},
    )
    report = {
        "benchmark": "bench_lora",
        "method": METHOD,
        "date": date.today().isoformat(),
        "device": opts.device,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "model": "SmolLM2-135M shapes, random init" if not opts.smoke else "tiny Llama (smoke)",
        "config": SMOKE if opts.smoke else SMOLLM2_135M,
        "smoke": opts.smoke,
        "adapter": {"kind": "lora", "rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "batch_size": opts.batch_size,
        "seq_len": opts.seq_len,
        "rounds": opts.rounds,
        "slice_steps": opts.slice,
        "warmup_steps": opts.warmup,
        "measure_time_s": measure_time,
        "ort": {"available": ort_check.available, "reason": ort_check.reason},
        "packages": {d: package_version(d) for d in ("torch", "transformers", "peft", "onnxruntime-training")},
        "noise_floor_ci95": noise,
        "results": list(results.values()),
    }
    name = f"lora-{opts.device}-{date.today().isoformat()}{'-smoke' if opts.smoke else ''}.json"
    path = write_report(report, opts.output, name)
    print_table(report)
    print(f"\nwritten to {path}")


def _parameters(out: Path) -> dict:
    """The run's parameters record (ORTTrainer writes it after the first step): trainable, total, optimizer bytes."""
    for metrics in out.glob("*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "parameters":
                return {k: record[k] for k in ("trainable", "total", "optimizer_state_bytes")}
    return {}


def print_table(report: dict) -> None:
    head = ("row", "samples/s", "vs full", "95% CI", "peak MB", "trainable", "opt. MB")
    print("\n{:<10} {:>10} {:>8} {:>14} {:>8} {:>12} {:>8}".format(*head))
    for r in report["results"]:
        if "error" in r:
            print(f"{r['mix']:<10} failed: {str(r['error'])[:100]}")
            continue
        ci = "{:.2f}-{:.2f}".format(*r["ratio_ci95"])
        optimizer_mb = r.get("optimizer_state_bytes", 0) / 2**20
        print(
            f"{r['mix']:<10} {r['samples_per_s']:>10.2f} {r['throughput_ratio']:>8.2f} {ci:>14} "
            f"{r.get('peak_mem_mb', 0):>8.0f} {r.get('trainable', 0):>12,} {optimizer_mb:>8.1f}"
        )
    if report["noise_floor_ci95"]:
        print("noise floor (full@2 / full): {:.2f}-{:.2f}".format(*report["noise_floor_ci95"]))


if __name__ == "__main__":
    main()
