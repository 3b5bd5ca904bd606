"""Each acceleration on a GPU against plain `transformers.Trainer` in fp32: samples/s, MFU and peak memory.

    python benchmarks/bench_gpu.py                  # on a CUDA machine: bert-base seq 128, SmolLM2-135M seq 512
    python benchmarks/bench_gpu.py --batch-size 256 --lm-batch-size 16
    python benchmarks/bench_gpu.py --smoke          # CPU, tiny shapes, two rows: checks the machinery (CI)

Models are built from their configurations (bert-base: transformers' BertConfig defaults; SmolLM2-135M: its
published shape), random weights: the same FLOPs as the real checkpoints, no download. Token ids are random.

The method is bench_trainer's, reused rather than copied (benchmarks/common.py's `interleave` and `analyze`,
bench_trainer's `random_tokens`, and the autotuner's `Stepper`/`slice_callback` protocol): every row trains in
its own process, all rows warm up first (torch.compile's compilation lands there and is reported apart), then
they train in interleaved slices round by round, and each row's ratio is the median of its per-round ratios to
the plain Trainer (two plain-Trainer processes give the noise floor), with a bootstrap 95 % interval.

Rows (bert suite): plain Trainer fp32 (twice), then through ortlab's trainer without ORT: tf32, bf16, fp16,
fused AdamW, torch.compile, eager attention (the plain Trainer already uses transformers' default SDPA attention,
so SDPA's gain is 1 / this row's ratio), and "best" (bf16 + TF32 + fused AdamW + torch.compile). The causal-LM
suite runs the plain Trainer and "best". A row that cannot run here (fp16 on a CPU ...) is listed with the reason.
MFU = samples/s x model FLOPs per sample (ortlab.flops) / the dense matmul peak of the row's matmul precision,
measured on this machine (ortlab.peak); `mfu_datasheet` beside it, against the GPU's datasheet peak where known.

Results: benchmarks/results/gpu-<date>.json (smoke: smoke-gpu-<date>.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_trainer import random_tokens  # noqa: E402
from common import analyze, cpu_name, interleave, write_report  # noqa: E402

BERT_ROWS = ["baseline", "baseline@2", "tf32", "bf16", "fp16", "fused_adam", "torch_compile", "attn_eager", "best"]
LM_ROWS = ["baseline", "baseline@2", "best"]
BEST = "bf16+tf32+fused_adam+torch_compile"
SMOKE_ROWS = ["baseline", "fused_adam", "tf32", "fp16"]


def config_for(shape: str):
    """Model configurations: the published shapes, or tiny ones for the smoke run."""
    from transformers import BertConfig, LlamaConfig

    if shape == "bert-base":
        return BertConfig(num_labels=2)  # 12 layers, hidden 768, 12 heads, ff 3072, vocab 30522: bert-base-uncased
    if shape == "smollm2-135m":
        return LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0,
        )  # fmt: skip
    if shape == "tiny-bert":
        return BertConfig(
            vocab_size=2000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            num_labels=2,
        )  # fmt: skip
    raise SystemExit(f"unknown --shape {shape!r}")


def build_model(shape: str, attention: str, config=None):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = config or config_for(shape)
    auto = AutoModelForCausalLM if config.model_type == "llama" else AutoModelForSequenceClassification
    return auto.from_config(config, attn_implementation=attention)


def lm_tokens(vocab: int, seq_len: int):
    import torch

    class Random(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(0, vocab, (seq_len,), generator=torch.Generator().manual_seed(i % 997))
            return {"input_ids": ids, "attention_mask": torch.ones(seq_len, dtype=torch.long), "labels": ids.clone()}

    return Random()


def parts_of(row: str) -> set[str]:
    name = row.partition("@")[0]
    return set((BEST if name == "best" else name).split("+")) - {"baseline"}


# --- one row (its own process) ---------------------------------------------------------------------------------


def child(opts: argparse.Namespace) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    from ortlab.tune import slice_callback

    torch.manual_seed(0)
    parts = parts_of(opts.mix)
    model = build_model(opts.shape, "eager" if "attn_eager" in parts else "sdpa")
    vocab = model.config.vocab_size
    data = lm_tokens(vocab, opts.seq_len) if opts.shape == "smollm2-135m" else random_tokens(vocab, opts.seq_len)
    common = {
        "output_dir": opts.out, "per_device_train_batch_size": opts.batch_size, "max_steps": 10**6,
        "learning_rate": 2e-5, "lr_scheduler_type": "constant", "report_to": [], "save_strategy": "no",
        "logging_steps": 10**6, "disable_tqdm": True, "dataloader_num_workers": 0, "use_cpu": opts.device == "cpu",
        "seed": 0,
    }  # fmt: skip
    if opts.mix.startswith("baseline"):
        trainer = Trainer(model=model, args=TrainingArguments(optim="adamw_torch", **common), train_dataset=data)
        step = lambda: (float("nan"), opts.batch_size)  # noqa: E731
    else:
        from ortlab.train.args import ORTTrainingArguments
        from ortlab.train.trainer import ORTTrainer

        args = ORTTrainingArguments(
            use_ort=False,
            optim="adamw_ort_fused" if "fused_adam" in parts else "adamw_torch",
            bf16="bf16" in parts,
            fp16="fp16" in parts,
            tf32="tf32" in parts,
            torch_compile="torch_compile" in parts,
            metrics_path="",
            **common,
        )
        trainer = ORTTrainer(model=model, args=args, train_dataset=data)
        step = lambda: (trainer._step_counters["loss"], trainer._step_counters["samples"])  # noqa: E731

    def applied():
        if opts.mix.startswith("baseline"):
            return {}, None
        return {k: v.applied for k, v in trainer.accelerations.items() if v.requested}, None

    trainer.add_callback(slice_callback(opts.device == "cuda", opts.warmup, step, applied))
    trainer.train()


# --- the driver ----------------------------------------------------------------------------------------------


def why_not(row: str, device: str) -> str | None:
    """Why `row` cannot run here (the mix rules' own words), or None."""
    from ortlab.accel import torch_compile
    from ortlab.accel.mix import Mix, problems

    parts = parts_of(row)
    precision = "bf16" if "bf16" in parts else "fp16" if "fp16" in parts else "fp32"
    mix = Mix(
        fused_adam="fused_adam" in parts, precision=precision, tf32="tf32" in parts, use_cpu=device == "cpu",
        torch_compile=False,  # checked below: this benchmark runs compile rows only where this torch compiles
    )  # fmt: skip
    errors, _ = problems(mix)
    if "torch_compile" in parts and not (a := torch_compile.availability()).available:
        errors.append(f"torch_compile: {a.reason}")
    return "; ".join(errors) or None


def model_flops(shape: str, seq_len: int) -> tuple[float, dict]:
    """Training FLOPs per sample (ortlab.flops), counted on the model built on the meta device (no memory)."""
    import torch

    from ortlab.flops import count_parameters, flops_per_sample

    config = config_for(shape)  # imported outside the meta context (transformers' lazy imports fail inside it)
    build_model(shape, "sdpa", config_for("tiny-bert"))
    with torch.device("meta"):
        model = build_model(shape, "sdpa", config)
    counted = count_parameters(model)
    return flops_per_sample(counted, seq_len), counted.to_dict()


def matmul_precision_of(row: str) -> str:
    parts = parts_of(row)
    return "bf16" if "bf16" in parts else "fp16" if "fp16" in parts else "tf32" if "tf32" in parts else "fp32"


def run_suite(opts: argparse.Namespace, shape: str, rows: list[str], batch: int, seq: int, tmp: str) -> dict:
    from ortlab.flops import peak_flops
    from ortlab.peak import PRECISIONS, measured_peak
    from ortlab.tune import Stepper

    results: dict[str, dict] = {}
    procs = {}
    for row in rows:
        reason = why_not(row, opts.device)
        if reason:
            results[row] = {"mix": row, "skipped": reason}
            print(f"[bench-gpu] {shape} {row}: skipped ({reason})", flush=True)
            continue
        results[row] = {"mix": row, "parts": sorted(parts_of(row))}
        name = f"{shape}-{row.replace('@', '-').replace('+', '-')}"
        cmd = [sys.executable, __file__, "--child", "--mix", row, "--out", f"{tmp}/{name}", "--shape", shape]
        cmd += ["--device", opts.device, "--batch-size", str(batch), "--seq-len", str(seq)]
        cmd += ["--warmup", str(opts.warmup)]
        procs[row] = Stepper(cmd, Path(tmp) / f"{name}.log")
    try:
        # Counted while the row processes load (each imports torch and transformers: seconds).
        flops, counted = model_flops(shape, seq)
        device_name = "cpu"
        if opts.device == "cuda":
            import torch

            device_name = torch.cuda.get_device_name(0)
    except BaseException:
        for proc in procs.values():
            proc.close()
        raise
    interleave(
        procs,
        results,
        warmup=opts.warmup,
        rounds=opts.rounds,
        slice_steps=opts.slice,
        tag=f"[bench-gpu] {shape}:",
        baseline="baseline",
        baseline_what="the plain-Trainer baseline",
    )
    measured = {k: v for k, v in results.items() if "skipped" not in v}
    if "baseline@2" not in measured:
        # analyze() pairs each row with the two plain-Trainer processes; with one, it uses that one alone.
        measured["baseline@2"] = {"mix": "baseline@2", "error": "not run (smoke)"}
    noise = analyze(measured)
    for row, r in results.items():
        if "samples_per_s" in r:
            precision = matmul_precision_of(row)
            achieved = r["samples_per_s"] * flops
            r["model_tflops_per_s"] = achieved / 1e12
            r["matmul_precision"] = precision
            measured = measured_peak(precision, opts.device)[0] if precision in PRECISIONS[opts.device] else None
            r["peak_measured_tflops"] = measured.flops / 1e12 if measured else None
            r["mfu"] = achieved / measured.flops if measured else None
            if measured is None:
                r["mfu_absent"] = f"no {precision} peak is measured on {opts.device}"
            datasheet = peak_flops(device_name, precision, opts.device)
            r["mfu_datasheet"] = achieved / datasheet.flops if datasheet.flops else None
            if not datasheet.flops:
                r["mfu_datasheet_absent"] = datasheet.reason
            if max(r["mfu"] or 0, r["mfu_datasheet"] or 0) > 1:  # (the H200's compiled fp32 row: 253 %)
                r["suspect"] = (
                    f"above the {precision} peak: the matmuls ran in another precision than the row's name says, or "
                    "the steps were not timed as they ran; do not quote this row"
                )
    return {
        "shape": shape,
        "batch_size": batch,
        "seq_len": seq,
        "flops_per_sample": flops,
        "model": counted,
        "noise_floor_ci95": noise,
        "results": [r for r in results.values() if r["mix"] != "baseline@2" or "slices" in r],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=128, help="bert suite (seq 128): fill the GPU")
    p.add_argument("--lm-batch-size", type=int, default=16, help="causal-LM suite (seq 512)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--slice", type=int, default=5, help="steps per row per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--suites", default="bert,lm")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, few steps: checks the machinery")
    p.add_argument("--output", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mix", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, default=128, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        child(opts)
        return
    if opts.smoke:
        opts.device, opts.rounds, opts.slice, opts.warmup = "cpu", 2, 1, 1
        suites = [("tiny-bert", SMOKE_ROWS, 4, 32)]
    else:
        import torch

        if opts.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("no CUDA device is visible: run this on a GPU machine, or --smoke for the CPU check")
        suites = []
        if "bert" in opts.suites:
            suites.append(("bert-base", BERT_ROWS, opts.batch_size, 128))
        if "lm" in opts.suites:
            suites.append(("smollm2-135m", LM_ROWS, opts.lm_batch_size, 512))
    from ortlab.accel import package_version

    started = time.monotonic()
    device = "cpu"
    if opts.device == "cuda":
        import torch

        device = torch.cuda.get_device_name(0)
    stem = ("smoke-" if opts.smoke else "") + f"gpu-{date.today().isoformat()}.json"
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-gpu-") as tmp:
        for suite in suites:
            out.append(run_suite(opts, *suite, tmp))
            # written after each suite: a lent GPU's time can end during the next one (it did, on an H200)
            report = {
                "benchmark": "bench_gpu",
                "smoke": opts.smoke,
                "date": date.today().isoformat(),
                "device": device,
                "cpu": cpu_name(),
                "cpu_count": os.cpu_count(),
                "rounds": opts.rounds,
                "slice_steps": opts.slice,
                "warmup_steps": opts.warmup,
                "elapsed_s": time.monotonic() - started,
                "packages": {d: package_version(d) for d in ("torch", "transformers", "triton", "deepspeed")},
                "suites": out,
                "complete": len(out) == len(suites),
            }
            path = write_report(report, opts.output, stem)
    for suite in out:
        print(f"\n{suite['shape']} seq {suite['seq_len']} batch {suite['batch_size']} on {device}")
        for r in suite["results"]:
            if "samples_per_s" not in r:
                print(f"  {r['mix']:38} {r.get('skipped') or r.get('error', '')}"[:160])
                continue
            if r.get("suspect"):
                print(f"  {r['mix']:38} SUSPECT: {r['suspect']}"[:160])
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
            sheet = f"{100 * r['mfu_datasheet']:.1f}%" if r.get("mfu_datasheet") else "-"
            print(
                f"  {r['mix']:38} {r['samples_per_s']:9.1f}/s  x{r['throughput_ratio']:.3f}  MFU {mfu:>6} measured, "
                f"{sheet:>6} datasheet  "
                f"warm-up {r['warmup_time_s']:.1f}s  peak {r.get('peak_mem_mb', 0):.0f} MB"
            )
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
