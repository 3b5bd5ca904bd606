"""The LoRA DPO job on SmolLM2 through ortlab's `PreferenceTrainer` against TRL's `DPOTrainer`: pairs/s, peak memory.

    .venv/bin/python benchmarks/bench_dpo_trl.py                  # CPU, the embedded SmolLM2, trl from test-artifacts
    .venv/bin/python benchmarks/bench_dpo_trl.py --smoke          # does it still run? (tests)

trl is not one of ortlab's dependencies: it is taken from a folder of its own, `--trl-site` (default: ORTLAB_TRL_SITE,
else test-artifacts/trl-site, where tests/helpers/trlsite.py installs it), and only the TRL processes put it on their
`sys.path`. The install: INSTALL below (`--no-deps`: ortlab's lock already holds what trl 1.16 needs).

The job (issue #44's "Speed and memory"): SmolLM2-135M-Instruct (embedded: converted from the GGUF on PyPI, nothing
downloads), the preference pairs `embedded:rotten-tomatoes-pairs` (TRL's conversational prompt/chosen/rejected),
LoRA rank 8 on q/k/v/o (alpha 16, dropout 0.05: ortlab's adapter defaults, given to TRL's peft config too), the
reference the base with the adapter disabled on both sides, DPO's sigmoid loss with beta 0.1, batch 4 pairs, max
length 128, learning rate 5e-5. Both sides read the same JSONL file of `--pairs` pairs (a seeded sample) in its
order (`train_sampling_strategy="sequential"` on both), so each round's slices train the same batches: the pairing
of the ratios then holds the sequence lengths equal too. The rows, each its own process:
- `ortlab`: `PreferenceTrainer` with `PreferenceTrainingArguments` built as a run builds its arguments
  (`ortlab.lifecycle.assemble.training_arguments` from a RunSpec with every acceleration at 'auto', decided by
  `ortlab.tune.decide` as a run decides it: on an adapter run, the precision probe on the run's own batches, fused
  AdamW and tcmalloc where available, no ORT), the pairs tokenized by `ortlab.data.pairtokens.tokenize_pairs` and
  collated by `ortlab.train.preferencebatch.PairCollator`;
- `trl`: `DPOTrainer` with `DPOConfig`'s defaults (`bf16=True`, `gradient_checkpointing=True`, `optim="adamw_torch"`,
  its linear schedule without warm-up, no weight decay) and the job's settings;
- `trl_equal`: the same with ortlab's decided precision (the driver asks a first process for the decision; ortlab's
  row then reads the probe's cached verdict), `gradient_checkpointing=False` and `optim="adamw_torch_fused"` (the
  same torch `AdamW(fused=True)` ortlab's fused AdamW is on a CPU). Still TRL's: its schedule, no weight decay
  (ortlab: 6 % warm-up, weight decay 0.01; neither changes a step's cost), and its extra metrics (entropy, token
  accuracy, logits means).

Method (bench_lora_trl's, `common.interleave`): every row trains in its own process, all warm up first, then train in
interleaved slices in a shuffled order; each row's slice over the `trl` row's slice of the same round is a paired
ratio (median, bootstrap 95 % interval). A step is `--batch-size` pairs on every side. Peak memory is each process's
VmHWM (`ru_maxrss`), read when it stops. Both sides train the same thing: each row reports its first step's loss and
the policy's mean log-probabilities of the chosen and rejected answers (with the adapter at zero the policy is the
reference, so the loss is log 2 on both; the log-probabilities of the same first batch agree up to the precision).
Results go to benchmarks/results/dpo-trl-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_lora_trl import LORA, TRL_VERSION  # noqa: E402
from common import (  # noqa: E402
    analyze,
    bootstrap_ci,
    check_trl_site,
    cpu_name,
    interleave,
    print_ratio_table,
    trl_row_inputs,
    trl_version,
    write_report,
)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATA = "embedded:rotten-tomatoes-pairs"
BETA, LEARNING_RATE = 0.1, 5e-5
DEFAULT_SITE = HERE.parent / "test-artifacts" / "trl-site"
INSTALL = (
    f'.venv/bin/uv pip install --target test-artifacts/trl-site "trl=={TRL_VERSION}" --no-deps '
    "--python .venv/bin/python"
)
FIRST = "[first-step] "  # the line each row prints with its first step's loss and log-probabilities
METHOD = (
    "interleaved slices in shuffled order; each row's slice over the TRL (defaults) row's slice of the same round; "
    "medians with bootstrap 95% intervals; peak memory = each process's VmHWM (ru_maxrss); same pairs, same order"
)


def job_spec(data_file: str, opts: argparse.Namespace) -> dict:
    """The job as a RunSpec dict (a causal LM with a LoRA adapter, what a run decides its accelerations for);
    accelerations at 'auto', except in the smoke run, which sets fp32: the precision probe takes minutes on a busy
    machine."""
    return {
        "task": "causal-lm",
        "model": {"name": MODEL},
        "data": {"source": data_file, "shuffle": False},
        "hyper": {
            "max_steps": 1000,  # the slices stop it long before
            "batch_size": opts.batch_size,
            "learning_rate": LEARNING_RATE,
            "max_length": opts.max_length,
            "logging_steps": 5,
        },
        "adapter": {"kind": "lora", "rank": LORA["rank"], "alpha": LORA["alpha"], "dropout": LORA["dropout"]},
        "accel": {"precision": "fp32"} if opts.smoke else {},
    }


def first_step_recorder(trainer_class: type) -> type:
    """`trainer_class` whose first training loss is printed (with the step's mean policy log-probabilities from
    the trainer's own metrics, which both trainers keep under TRL's names) as one JSON line after FIRST."""

    class Recorded(trainer_class):
        _first_done = False

        def compute_loss(self, model, inputs, *args, **kwargs):
            out = super().compute_loss(model, inputs, *args, **kwargs)
            if not self._first_done and self.model.training:
                self._first_done = True
                loss = out[0] if isinstance(out, tuple) else out
                metrics = self._metrics["train"]
                said = {"loss": float(loss)} | {k: metrics[k][-1] for k in ("logps/chosen", "logps/rejected")}
                print(FIRST + json.dumps(said), file=sys.stderr, flush=True)
            return out

    return Recorded


# --- the rows (each its own process) ---------------------------------------------------------------------------


def ortlab_rows(opts: argparse.Namespace):
    """The model with its adapter, the tokenizer, the tokenized pairs and the collator, as ortlab's row trains
    them, and the run's decision for its 'auto' accelerations."""
    from datasets import load_dataset

    from ortlab.adapters import apply_lora
    from ortlab.data.pairs import propose_pairs_mapping
    from ortlab.data.pairtokens import tokenize_pairs
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec
    from ortlab.tasks import load_model, load_tokenizer, resolve_model
    from ortlab.train.preferencebatch import PairCollator
    from ortlab.tune import decide

    log = lambda message: print(f"[ortlab] {message}", file=sys.stderr, flush=True)  # noqa: E731
    spec = RunSpec.parse(job_spec(opts.data_file, opts))
    run = RunDir.create(opts.out, spec)
    model_path = resolve_model(MODEL)
    tokenizer = load_tokenizer(model_path)
    model = apply_lora(load_model(model_path, spec.task, [], None, tokenizer.pad_token_id), spec.adapter, spec.task)
    pairs = load_dataset("json", data_files=opts.data_file, split="train")
    train = tokenize_pairs(pairs, propose_pairs_mapping(pairs), tokenizer, opts.max_length)
    collate = PairCollator(tokenizer.pad_token_id, max_length=opts.max_length)
    choice, _, why = decide(
        spec,
        model_path=model_path,
        label_names=None,
        train_dataset=train,
        collate=collate,
        progress=log,
        log_dir=run.path / "logs",
        model=model,
    )
    log(f"auto: {choice} ({why})")
    return spec, run, model, tokenizer, train, collate, choice, why


def ortlab_child(opts: argparse.Namespace) -> None:
    from dataclasses import fields

    from ortlab.accel.mix import resolve
    from ortlab.lifecycle.assemble import training_arguments
    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.preferencetrainer import PreferenceTrainer, PreferenceTrainingArguments
    from ortlab.tune import slice_callback

    spec, run, model, tokenizer, train, collate, choice, why = ortlab_rows(opts)
    if opts.child == "ortlab_decide":  # the driver's question: which precision does the run train in?
        print(json.dumps({"precision": resolve(spec.accel, choice).precision}), flush=True)
        return
    run_args = training_arguments(spec, run, False, choice)  # as a run builds them
    values = {f.name: getattr(run_args, f.name) for f in fields(ORTTrainingArguments) if f.init}
    args = PreferenceTrainingArguments(**values, preference_loss="dpo", beta=BETA, max_length=opts.max_length)
    trainer = first_step_recorder(PreferenceTrainer)(
        model=model, args=args, train_dataset=train, data_collator=collate, processing_class=tokenizer
    )
    optim = getattr(args.optim, "value", args.optim)
    print(
        f"[ortlab] reference={trainer.reference} optim={optim} bf16={args.bf16} use_ort={args.use_ort} "
        f"gradient_checkpointing={args.activation_checkpointing} tcmalloc={args.tcmalloc} "
        f"prompt_shared={trainer.prompt_sharing['applied']}",
        file=sys.stderr,
        flush=True,
    )
    step = lambda: (trainer._step_counters["loss"], opts.batch_size)  # noqa: E731  (pairs per step)

    def applied():
        return {k: v.applied for k, v in trainer.accelerations.items() if v.requested}, why

    trainer.add_callback(slice_callback(False, opts.warmup, step, applied))
    trainer.train()


def trl_child(opts: argparse.Namespace) -> None:
    from peft import LoraConfig

    from ortlab.tune import slice_callback

    trl, tokenizer, model, dataset = trl_row_inputs(opts.trl_site, MODEL, opts.data_file)

    job = {  # the job's own settings; everything else is DPOConfig's default
        "output_dir": opts.out,
        "per_device_train_batch_size": opts.batch_size,
        "learning_rate": LEARNING_RATE,
        "beta": BETA,
        "max_length": opts.max_length,
        "max_steps": 1000,
        "train_sampling_strategy": "sequential",  # the same pairs in the same order as ortlab's row
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "use_cpu": True,
    }
    if opts.child == "trl_equal":  # ortlab's settings where they are a choice of speed or memory
        job |= {"bf16": opts.precision == "bf16", "gradient_checkpointing": False, "optim": "adamw_torch_fused"}
    elif opts.smoke:
        job["bf16"] = False  # the smoke run is fp32 throughout
    config = trl.DPOConfig(**job)
    lora = LoraConfig(
        r=LORA["rank"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        target_modules=LORA["target_modules"],
        task_type="CAUSAL_LM",
    )
    trainer = first_step_recorder(trl.DPOTrainer)(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora
    )
    print(
        f"[trl {trl.__version__}] bf16={config.bf16} gradient_checkpointing={config.gradient_checkpointing} "
        f"optim={config.optim.value} loss_type={config.loss_type} beta={config.beta} "
        f"precompute_ref_log_probs={config.precompute_ref_log_probs} padding_free={config.padding_free}",
        file=sys.stderr,
        flush=True,
    )
    step = lambda: (float("nan"), opts.batch_size)  # noqa: E731  (pairs per step)

    def applied():
        return {"bf16": bool(config.bf16), "gradient_checkpointing": bool(config.gradient_checkpointing)}, None

    trainer.add_callback(slice_callback(False, opts.warmup, step, applied))
    trainer.train()


# --- the driver ----------------------------------------------------------------------------------------------


def write_data(folder: Path, pairs: int) -> Path:
    """A seeded sample of `pairs` pairs of the embedded preference data, as the one JSONL file both sides read."""
    from ortlab.assets import embedded_dataset

    source, _ = embedded_dataset(DATA.removeprefix("embedded:"))
    lines = [ln for ln in source.read_text(encoding="utf-8").splitlines() if ln.strip()]
    lines = random.Random(0).sample(lines, min(pairs, len(lines)))
    out = folder / "pairs.jsonl"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def decided_precision(opts: argparse.Namespace, data_file: Path, tmp: str, env: dict) -> str:
    """The precision ortlab's run decides for this job here (the probe, in a process of its own, whose verdict
    is cached for ortlab's row); the smoke run is fp32."""
    if opts.smoke:
        return "fp32"
    cmd = [sys.executable, __file__, "--child", "ortlab_decide", "--data-file", str(data_file), "--out", f"{tmp}/d"]
    cmd += ["--batch-size", str(opts.batch_size), "--max-length", str(opts.max_length)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"ortlab's precision decision failed:\n{done.stderr[-3000:]}")
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("[ortlab] auto")]
    print(f"[bench] {said[-1] if said else 'decided'}", flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["precision"]


def first_steps(log: Path) -> dict | None:
    """The FIRST line a row printed (its first step's loss and log-probabilities), or None."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(FIRST):
            return json.loads(line.removeprefix(FIRST))
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_site = os.environ.get("ORTLAB_TRL_SITE") or (str(DEFAULT_SITE) if DEFAULT_SITE.is_dir() else None)
    p.add_argument("--trl-site", default=default_site, help="folder trl was installed into")
    p.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--pairs", type=int, default=400, help="pairs both sides read")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (each row trains --slice steps)")
    p.add_argument("--slice", type=int, default=2, help="steps per row per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="batch 2, 24 pairs, 2 rounds of 1 step, fp32 (no probe): checks the script, not speed",
    )
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/dpo-trl-<date>.json)")
    p.add_argument("--note", default=None, help="written into the result, e.g. the machine's load")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child in ("ortlab", "ortlab_decide"):
        ortlab_child(opts)
        return
    if opts.child in ("trl", "trl_equal"):
        trl_child(opts)
        return
    opts.trl_site = check_trl_site(opts.trl_site, "bench_dpo_trl", INSTALL)
    if opts.smoke:
        opts.batch_size, opts.pairs, opts.rounds, opts.slice, opts.warmup = 2, 24, 2, 1, 1

    from ortlab.accel import package_version, tcmalloc
    from ortlab.envvars import child_env
    from ortlab.tasks import resolve_model
    from ortlab.tune import Stepper

    load_before = load_average()
    print("[bench] the embedded SmolLM2 (converted once from its GGUF) ...", flush=True)
    resolve_model(MODEL)  # made here, once, so no row pays (or races for) the conversion
    rows = ["trl", "ortlab", "trl_equal"]
    results: dict[str, dict] = {name: {"mix": name} for name in rows}
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-dpo-") as tmp:
        data_file = write_data(Path(tmp), opts.pairs)
        # ortlab's rows start with the allocator a launched ortlab run gets (tcmalloc where it is installed);
        # TRL's with glibc's malloc, what a TRL user runs
        envs = {
            name: tcmalloc.process_env(child_env(), on=name == "ortlab" and tcmalloc.wanted("auto")) for name in rows
        }
        precision = decided_precision(opts, data_file, tmp, envs["ortlab"])
        print(f"[bench] ortlab's run trains in {precision}: trl_equal too; {len(rows)} processes", flush=True)
        procs = {}
        for name in rows:
            out = f"{tmp}/{name}"
            cmd = [sys.executable, __file__, "--child", name, "--data-file", str(data_file), "--out", out]
            cmd += ["--trl-site", opts.trl_site, "--warmup", str(opts.warmup), "--precision", precision]
            cmd += ["--batch-size", str(opts.batch_size), "--max-length", str(opts.max_length)]
            cmd += ["--smoke"] if opts.smoke else []
            procs[name] = Stepper(cmd, Path(f"{out}.log"), env=envs[name])
        measure_time = interleave(
            procs,
            results,
            warmup=opts.warmup,
            rounds=opts.rounds,
            slice_steps=opts.slice,
            baseline="trl",
            baseline_what="TRL's DPOTrainer",
        )
        for name in rows:  # what each side said about its settings, and its first step
            log = Path(f"{tmp}/{name}.log")
            lines = log.read_text(errors="replace").splitlines()
            results[name]["said"] = [
                ln[:300] for ln in lines if ln.startswith(("[ortlab] auto", "[ortlab] ref", "[trl "))
            ]
            results[name]["first_step"] = first_steps(log)
    analyze(results, baseline="trl")
    to_equal(results)
    report = {
        "benchmark": "bench_dpo_trl",
        "method": METHOD,
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "model": MODEL + " (embedded)",
        "data": f"{DATA}, a seeded sample of {opts.pairs} pairs, read in order by every row",
        "adapter": LORA,
        "reference": "the base model with the adapter disabled (both sides)",
        "loss": {"type": "sigmoid (DPO)", "beta": BETA},
        "learning_rate": LEARNING_RATE,
        "batch_size_pairs": opts.batch_size,
        "max_length": opts.max_length,
        "ortlab_precision": precision,
        "rounds": opts.rounds,
        "slice_steps": opts.slice,
        "warmup_steps": opts.warmup,
        "measure_time_s": measure_time,
        "smoke": opts.smoke,
        "note": opts.note,
        "settings": SETTINGS | {"trl_equal": SETTINGS["trl_equal"].replace("PRECISION", precision)},
        "first_step_check": first_step_check(results),
        "packages": {d: package_version(d) for d in ("torch", "transformers", "peft")}
        | {"trl": trl_version(opts.trl_site)},
        "results": list(results.values()),
    }
    name = f"dpo-trl-{date.today().isoformat()}{'-smoke' if opts.smoke else ''}.json"
    path = write_report(report, opts.output, name)
    print_ratio_table(report, unit="pairs/s")
    ortlab = results["ortlab"]
    if "ratio_to_trl_equal" in ortlab:
        lo, hi = ortlab["ratio_to_trl_equal_ci95"]
        print(
            f"ortlab vs trl_equal: {ortlab['ratio_to_trl_equal']:.2f} ({lo:.2f}-{hi:.2f}), peak memory "
            f"{ortlab['peak_mem_ratio_to_trl_equal']:.2f}"
        )
    print(f"\nfirst step: {json.dumps(report['first_step_check'])}\nwritten to {path}")


# What differs between the rows (besides the job's own settings, equal on all three).
SETTINGS = {
    "ortlab": "ortlab's run decision: precision from the probe, fused AdamW (torch AdamW(fused=True)), tcmalloc, "
    "no gradient checkpointing, no ORT; 6% warm-up, weight decay 0.01 (RunSpec defaults)",
    "trl": "DPOConfig's defaults: bf16=True, gradient_checkpointing=True, optim adamw_torch (not fused), glibc malloc, "
    "no warm-up, no weight decay",
    "trl_equal": "as trl but PRECISION (ortlab's decision), gradient_checkpointing=False, optim adamw_torch_fused; "
    "still glibc malloc, no warm-up, no weight decay, and TRL's extra metrics",
}


def to_equal(results: dict[str, dict]) -> None:
    """ortlab's row against TRL at equal settings too: the paired ratio of its slices to trl_equal's of the same
    rounds (median, bootstrap 95 % interval) and the ratio of the peaks, into ortlab's row."""
    a, b = results["ortlab"], results["trl_equal"]
    if "error" in a or "error" in b:
        return
    paired = [x / y for x, y in zip(a["slices"], b["slices"], strict=True)]
    a["ratio_to_trl_equal"] = statistics.median(paired)
    a["ratio_to_trl_equal_ci95"] = list(bootstrap_ci(paired))
    if a.get("peak_mem_mb") and b.get("peak_mem_mb"):
        a["peak_mem_ratio_to_trl_equal"] = a["peak_mem_mb"] / b["peak_mem_mb"]


def first_step_check(results: dict[str, dict]) -> dict:
    """ortlab's and trl_equal's first steps side by side: the same loss (log 2 with the adapter at zero) and the
    same policy log-probabilities of the same first batch, up to the precision."""
    a, b = (results[n].get("first_step") for n in ("ortlab", "trl_equal"))
    out = {"log_2": math.log(2), "ortlab": a, "trl_equal": b}
    if a and b:
        out["loss_abs_diff"] = abs(a["loss"] - b["loss"])
        out["logps_chosen_abs_diff"] = abs(a["logps/chosen"] - b["logps/chosen"])
        out["logps_rejected_abs_diff"] = abs(a["logps/rejected"] - b["logps/rejected"])
    return out


if __name__ == "__main__":
    main()
