"""Why ORTModule trains slower than eager PyTorch on a 2-core CPU, and which of its knobs help (issue #13, item 3).

    .venv/bin/python benchmarks/ort_cpu_study.py                      # every variant, interleaved (~10 min)
    .venv/bin/python benchmarks/ort_cpu_study.py --variants ort,ort-intra1 --rounds 20
    .venv/bin/python benchmarks/ort_cpu_study.py --parity             # per-step losses, dropout off, vs eager
    .venv/bin/python benchmarks/ort_cpu_study.py --profile ort        # where one variant's step time goes

Each variant trains all-MiniLM-L6-v2 (sequence classification, batch 16, seq 128, random token ids) with
ortlab's ORTTrainer in its own process: ORTModule keeps global state, environment switches are read when a
process starts, and ORT's thread pool must not meet another variant's. All processes are started and warmed
up first, then they train in interleaved slices (A B C ... A B C ...) driven by `ortlab.tune.Stepper` (the loop
is benchmarks/common.py's `interleave`), and each slice is compared with the eager slice of the same round
(paired ratios; medians with a bootstrap 95 % interval). On this shared machine one run after another differs
by 15-30 %; a pair within a round does not.

Two eager references: `eager-sdpa` is what a plain Trainer runs (transformers' default attention, SDPA) and
`eager-attn` uses the same eager attention ORTModule needs (ORT 1.19 cannot build SDPA's gradient). A second
`eager-sdpa@2` gives the noise floor. ORT variants differ from `ort` (ortlab as it was) in one setting each:
ONNX Runtime session options (applied through `ortlab.accel.ort.configure_session`), ORTMODULE_* environment
switches, or the process's thread settings.

Results: benchmarks/results/ort-cpu-study-<date>.json (and -parity-/-profile- files for those modes).
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

from bench_trainer import default_model, random_tokens  # noqa: E402
from common import bootstrap_ci, cpu_name, interleave  # noqa: E402

# name: (ort, attention, session settings, environment, what it tests)
VARIANTS: dict[str, dict] = {
    "eager-sdpa": {"ort": False, "attn": "sdpa", "why": "plain PyTorch as Trainer runs it (SDPA attention)"},
    "eager-sdpa@2": {"ort": False, "attn": "sdpa", "why": "the same again: the noise floor"},
    "eager-attn": {"ort": False, "attn": "eager", "why": "PyTorch with the eager attention ORT runs"},
    "ort": {"ort": True, "session": {}, "why": "ORTModule as ortlab created it before this study"},
    "ort-ortlab": {"ort": True, "why": "ORTModule with ortlab's CPU session defaults (ortlab.accel.ort.CPU_SESSION)"},
    "ort-intra1": {"ort": True, "session": {"intra_op_num_threads": 1}, "why": "ORT intra-op pool: 1 thread"},
    "ort-intra2": {"ort": True, "session": {"intra_op_num_threads": 2}, "why": "ORT intra-op pool: 2 threads"},
    "ort-nospin": {
        "ort": True,
        "session": {"session.intra_op.allow_spinning": "0"},
        "why": "ORT's idle pool threads sleep instead of spinning (they would compete with torch's)",
    },
    "ort-memreuse": {
        "ort": True,
        "session": {"enable_mem_pattern": True, "enable_mem_reuse": True},
        "why": "memory pattern and reuse on (ORTModule turns both off)",
    },
    "ort-nocompute": {
        "ort": True,
        "env": {"ORTMODULE_ENABLE_COMPUTE_OPTIMIZER": "0"},
        "why": "compute optimizer (and its label/embedding sparsity passes) off",
    },
    "ort-nosparse": {
        "ort": True,
        "env": {"ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER": "0", "ORTMODULE_ENABLE_LABEL_SPARSE_OPTIMIZER": "0"},
        "why": "embedding and label sparsity optimizers off (compute optimizer on)",
    },
    "ort-memopt1": {"ort": True, "env": {"ORTMODULE_MEMORY_OPT_LEVEL": "1"}, "why": "layer-wise recompute"},
    "ort-opset15": {"ort": True, "env": {"ORTMODULE_ONNX_OPSET_VERSION": "15"}, "why": "export at opset 15 (17)"},
    "ort-basic": {
        "ort": True,
        "session": {"graph_optimization_level": "ORT_ENABLE_BASIC"},
        "why": "session graph optimisation: basic only (default: all)",
    },
    "ort-omp-passive": {
        "ort": True,
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
        "why": "torch's OpenMP threads sleep when idle (set before torch starts)",
    },
    "eager-sdpa-omp-passive": {
        "ort": False,
        "attn": "sdpa",
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
        "why": "plain PyTorch (SDPA), OpenMP threads sleep when idle",
    },
    "eager-attn-omp-passive": {
        "ort": False,
        "attn": "eager",
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
        "why": "PyTorch with eager attention, OpenMP threads sleep when idle",
    },
    "ort-nospin-omp-passive": {
        "ort": True,
        "session": {"session.intra_op.allow_spinning": "0"},
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
        "why": "neither ORT's nor torch's idle threads spin",
    },
    "ort-torch1": {"ort": True, "torch_threads": 1, "why": "torch.set_num_threads(1) (ORT keeps 2)"},
}
DEFAULT = [
    "eager-sdpa",
    "eager-sdpa@2",
    "eager-attn",
    "ort",
    "ort-intra1",
    "ort-nospin",
    "ort-memreuse",
    "ort-nocompute",
    "ort-nosparse",
    "ort-memopt1",
    "ort-omp-passive",
]


# --- one variant (its own process) ---------------------------------------------------------------------------


def build_trainer(opts: argparse.Namespace, variant: dict, dropout: bool = True):
    import torch
    from transformers import AutoModelForSequenceClassification

    from ortlab.accel import ort
    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.trainer import ORTTrainer

    if variant.get("torch_threads"):
        torch.set_num_threads(variant["torch_threads"])
    session = dict(variant.get("session") or {})
    if "graph_optimization_level" in session:
        import onnxruntime

        session["graph_optimization_level"] = onnxruntime.GraphOptimizationLevel[session["graph_optimization_level"]]
    if "session" in variant:
        ort.CPU_SESSION.clear()  # a variant with session settings states them all; the others get ortlab's
        ort.CPU_SESSION.update(session)
    torch.manual_seed(0)
    extra = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = AutoModelForSequenceClassification.from_pretrained(
        opts.model, num_labels=2, attn_implementation=variant.get("attn", "eager"), **extra
    )
    vocab = model.config.vocab_size

    args = ORTTrainingArguments(
        output_dir=opts.out,
        use_ort=variant["ort"],
        ort_log_level="ERROR",
        ort_fallback="error",
        optim="adamw_torch",
        per_device_train_batch_size=opts.batch_size,
        max_steps=10**6,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=True,
        seed=0,
        metrics_path="",
    )
    return ORTTrainer(model=model, args=args, train_dataset=random_tokens(vocab, opts.seq_len))


def child(opts: argparse.Namespace) -> None:
    from ortlab.tune import slice_callback

    variant = VARIANTS[opts.variant]
    trainer = build_trainer(opts, variant, dropout=not opts.no_dropout)

    def step():
        return trainer._step_counters["loss"], trainer._step_counters["samples"]

    def applied():
        import torch

        out = {"torch_threads": torch.get_num_threads()}
        module = trainer._ort_module
        if module is not None:
            from ortlab.accel import ort

            out["ran_in_ort"] = ort.ran_in_ort(module)
            out["session"] = {k: str(v) for k, v in getattr(module, "_ortlab_session", {}).items()}
        return out, None

    trainer.add_callback(slice_callback(False, opts.warmup, step, applied))
    # The losses the trainer counts are summed per step: reset the counter after each step.
    from transformers import TrainerCallback

    class Reset(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            trainer._step_counters["loss"] = 0.0
            trainer._step_counters["samples"] = 0

    trainer.add_callback(Reset())
    trainer.train()


# --- the driver -----------------------------------------------------------------------------------------------


def _stepper(opts: argparse.Namespace, name: str, tmp: str, *extra: str):
    from ortlab.tune import Stepper

    env = VARIANTS[name].get("env", {})
    cmd = [sys.executable, __file__, "--child", "--variant", name, "--out", f"{tmp}/{name}"]
    for key in ("model", "batch_size", "seq_len", "warmup"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(opts, key))]
    cmd += list(extra)
    # Environment switches must be there before the child imports torch/onnxruntime.
    from ortlab.envvars import temporary_env

    with temporary_env(env):
        return Stepper(cmd, Path(tmp) / f"{name}.log")


def measure(opts: argparse.Namespace, names: list[str]) -> dict:
    results: dict[str, dict] = {n: {"variant": n, "why": VARIANTS[n]["why"]} for n in names}
    with tempfile.TemporaryDirectory(prefix="ortlab-ort-study-") as tmp:
        procs = {n: _stepper(opts, n, tmp) for n in names}

        def report(r: int, live: dict) -> None:
            base = results[opts.reference]["slices"]
            print(
                f"[study] round {r + 1}/{opts.rounds}: "
                + ", ".join(f"{n} {results[n]['slices'][-1] / base[-1]:.2f}" for n in live if results[n]["slices"]),
                flush=True,
            )

        elapsed = interleave(
            procs,
            results,
            warmup=opts.warmup,
            rounds=opts.rounds,
            slice_steps=opts.slice,
            tag="[study]",
            warmup_key="warmup_s",
            keep_losses=True,
            keep_memory=False,
            on_round=report,
        )
    for ref in ("eager-sdpa", "eager-attn"):
        base = results.get(ref, {}).get("slices")
        if not base:
            continue
        for r in results.values():
            if "error" in r or len(r.get("slices", [])) != len(base):
                continue
            paired = [a / b for a, b in zip(r["slices"], base, strict=True)]
            r[f"vs_{ref}"] = statistics.median(paired)
            r[f"vs_{ref}_ci95"] = list(bootstrap_ci(paired))
    for r in results.values():
        if r.get("slices"):
            r["samples_per_s"] = statistics.median(r["slices"])
            r["mean_loss"] = statistics.fmean(r["losses"])
    return {"measure_s": elapsed, "results": list(results.values())}


def parity(opts: argparse.Namespace, names: list[str]) -> dict:
    """Per-step losses with dropout off (ORT's dropout draws other random numbers than torch's), each variant
    against eager-attn on the same batches from the same seed: ortlab's ORT/eager parity tolerance is 2e-3."""
    names = ["eager-attn", *[n for n in names if n != "eager-attn" and VARIANTS[n]["ort"]]]
    out: dict[str, list[float] | str] = {}
    with tempfile.TemporaryDirectory(prefix="ortlab-ort-parity-") as tmp:
        for n in names:
            p = _stepper(opts, n, tmp, "--no-dropout")
            try:
                ok = p.start() is not None and p.run(opts.warmup) is not None
                reply = p.run(opts.parity_steps) if ok else None
                out[n] = reply["losses"] if reply else p.failure()
                p.finish()
            finally:
                p.close()
            print(f"[parity] {n}: {out[n]}", flush=True)
    ref = out["eager-attn"]
    table = {}
    for n, losses in out.items():
        if isinstance(losses, str) or isinstance(ref, str):
            table[n] = {"error": losses if isinstance(losses, str) else ref}
            continue
        diff = max(abs(a - b) for a, b in zip(losses, ref, strict=True))
        table[n] = {"losses": losses, "max_abs_diff_vs_eager": diff, "within_2e-3": diff < 2e-3}
    return table


def profile(opts: argparse.Namespace, name: str) -> dict:
    """Where one variant's step goes: ONNX Runtime's own kernel profile by operator (ORT variants), torch's
    profiler by operator (eager), and Python's share of the step (cProfile, outside the runtime calls)."""
    import cProfile
    import pstats

    import torch

    variant = VARIANTS[name]
    for k, v in variant.get("env", {}).items():
        os.environ[k] = v
    trainer = None
    prefix = tempfile.mkdtemp(prefix="ortlab-ort-prof-") + "/ort"
    if variant["ort"]:
        from ortlab.accel import ort

        base = dict(variant["session"]) if "session" in variant else dict(ort.CPU_SESSION)
        variant = {**variant, "session": {**base, "enable_profiling": True, "profile_file_prefix": prefix}}
    opts.out = tempfile.mkdtemp(prefix="ortlab-ort-prof-out-")
    trainer = build_trainer(opts, variant)
    model = trainer.model
    from ortlab.accel import ort

    module = ort.wrap(model, trainer.args.ort_options) if variant["ort"] else model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(1000, model.config.vocab_size, (opts.batch_size, opts.seq_len), generator=g),
        "attention_mask": torch.ones(opts.batch_size, opts.seq_len, dtype=torch.long),
        "labels": torch.arange(opts.batch_size) % 2,
    }
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def step(timed: bool) -> None:
        t0 = time.perf_counter()
        loss = module(**batch).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        if timed:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases[k] += v

    for _ in range(opts.warmup):
        step(False)
    if variant["ort"]:
        agent = module._torch_module._execution_manager(True)._execution_agent
    steps = opts.profile_steps
    prof = cProfile.Profile()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tprof:
        prof.enable()
        started = time.perf_counter()
        for _ in range(steps):
            step(True)
        wall = time.perf_counter() - started
        prof.disable()
    stats = pstats.Stats(prof)
    runtime_calls = ("run_forward", "run_backward")
    in_ort = sum(
        v[2] for k, v in stats.stats.items() if k[2].startswith("<built-in method") and k[2].endswith(runtime_calls)
    )
    report: dict = {
        "variant": name,
        "steps": steps,
        "step_s": wall / steps,
        "phases_s_per_step": {k: v / steps for k, v in phases.items()},
    }
    torch_ops = sorted(tprof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    report["torch_ops_ms_per_step"] = {
        e.key: round(e.self_cpu_time_total / 1000 / steps, 2) for e in torch_ops[:20] if e.self_cpu_time_total > 0
    }
    if variant["ort"]:
        report["ort_run_calls_s_per_step"] = in_ort / steps
        report["python_and_torch_outside_ort_s_per_step"] = (wall - in_ort) / steps
        path = agent._inference_session.end_profiling()
        events = json.loads(Path(path).read_text())
        by_op: dict[str, float] = {}  # every step since the session started (the warm-up too): shares only
        total = 0.0
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                op = e["args"]["op_name"]
                by_op[op] = by_op.get(op, 0.0) + e["dur"]
                total += e["dur"]
        report["ort_kernels_share"] = {
            op: round(d / total, 4) for op, d in sorted(by_op.items(), key=lambda kv: -kv[1])[:20]
        }
        report["ort_profile_file"] = path
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--slice", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--reference", default="eager-sdpa")
    p.add_argument("--parity", action="store_true", help="compare per-step losses (dropout off) instead")
    p.add_argument("--parity-steps", type=int, default=4)
    p.add_argument("--profile", default=None, help="profile one variant in this process")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--output", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-dropout", action="store_true", help=argparse.SUPPRESS)
    opts = p.parse_args()
    opts.model = opts.model or default_model()
    if opts.child:
        child(opts)
        return
    names = opts.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants: {unknown}")
    from ortlab.accel import package_version

    header = {
        "benchmark": "ort_cpu_study",
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "model": opts.model,
        "batch_size": opts.batch_size,
        "seq_len": opts.seq_len,
        "packages": {d: package_version(d) for d in ("torch", "transformers", "onnxruntime-training")},
    }
    if opts.profile:
        report = {**header, **profile(opts, opts.profile)}
        kind = f"profile-{opts.profile}"
    elif opts.parity:
        report = {**header, "parity": parity(opts, names)}
        kind = "parity"
    else:
        report = {
            **header,
            "method": "one process per variant, interleaved slices, paired ratios (median, bootstrap 95% CI)",
            "rounds": opts.rounds,
            "slice_steps": opts.slice,
            "warmup_steps": opts.warmup,
            **measure(opts, names),
        }
        kind = None
    name = f"ort-cpu-study-{kind + '-' if kind else ''}{date.today().isoformat()}.json"
    path = Path(opts.output) if opts.output else HERE / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    if "results" in report:
        print(f"\n{'variant':18} {'samples/s':>9} {'vs sdpa':>8} {'95% CI':>13} {'vs attn':>8} {'loss':>7}  why")
        for r in report["results"]:
            if "error" in r:
                print(f"{r['variant']:18} ERROR {r['error'][:80]}")
                continue
            lo, hi = r.get("vs_eager-sdpa_ci95", (float("nan"),) * 2)
            print(
                f"{r['variant']:18} {r['samples_per_s']:9.2f} {r.get('vs_eager-sdpa', float('nan')):8.3f} "
                f"{lo:6.3f}-{hi:6.3f} {r.get('vs_eager-attn', float('nan')):8.3f} {r['mean_loss']:7.4f}  {r['why']}"
            )
    else:
        print(json.dumps({k: v for k, v in report.items() if k not in header}, indent=1))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
