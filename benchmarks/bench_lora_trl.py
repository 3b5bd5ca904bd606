"""The LoRA SmolLM2 job through ortlab against TRL's `SFTTrainer` with its defaults: examples/s and peak memory.

    .venv/bin/python benchmarks/bench_lora_trl.py --trl-site /tmp/trl-site           # CPU, the embedded SmolLM2
    .venv/bin/python benchmarks/bench_lora_trl.py --trl-site /tmp/trl-site --smoke   # does it still run? (tests)

trl is not one of ortlab's dependencies and is not in the shared environment: install it into a folder of its own,
    .venv/bin/uv pip install --target /tmp/trl-site "trl==1.16.0" --no-deps --python .venv/bin/python
and name the folder with `--trl-site`; only the TRL processes put it on their `sys.path` (ortlab's row never sees
trl). trl 1.16.0's requirements (transformers >= 4.56.2, accelerate >= 1.11, datasets >= 4.7, torch >= 2.6) hold in
ortlab's lock, so `--no-deps` installs nothing else.

The job is notebook 05's (`05-small-llm-lora`): SmolLM2-135M-Instruct (embedded: converted from the GGUF on PyPI,
nothing downloads), the Rotten Tomatoes conversations (`embedded:rotten-tomatoes-chat`, TRL's `messages` format),
LoRA rank 8 on the attention projections, batch 8, learning rate 1e-3, max length 128. Both sides read the same
JSONL file of `--examples` conversations. The job's own settings are given to both (model, data, adapter, batch,
learning rate, length); every other setting is each tool's default:
- `ortlab`: ortlab's own path, as `ortlab train` assembles it (`ortlab.fit.check_model_and_data`,
  `ortlab.lifecycle.assemble`), with every acceleration left at 'auto' and decided as a run decides it (the
  precision probe runs at load);
- `trl`: `SFTTrainer` with `SFTConfig`'s defaults (among them `bf16=True` and `gradient_checkpointing=True`) and a
  peft `LoraConfig` with ortlab's adapter settings (rank 8, alpha 16, dropout 0.05, q/k/v/o);
- `trl_fp32` (unless `--no-trl-fp32`): the same with `bf16=False`, so a reader sees how much of the ratio is the
  precision default alone;
- with `--equal`, two rows at equal settings, for memory: `trl_equal` (`bf16=False`, `gradient_checkpointing=False`:
  what ortlab trains with here) and `ortlab_fp32` (`accel.precision: fp32` set, so no precision probe runs in the
  process: the probe's trials count in the `ortlab` row's peak);
- with `--checkpointing`, `ortlab_ckpt`: ortlab's defaults plus `hyper.gradient_checkpointing` (what TRL's default
  does), for the memory goal against TRL's defaults.

Method (bench_lora's): every row trains in its own process, all warm up first, then train in interleaved slices in
a shuffled order; each row's slice over TRL's slice of the same round is a paired ratio (median, bootstrap 95 %
interval). Neither side packs by default, so a step is `--batch-size` conversations on both: examples/s is
comparable as is. Peak memory is each process's VmHWM (its peak resident set, `ru_maxrss`), read when it stops.
Results go to benchmarks/results/lora-trl-<date>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import (  # noqa: E402
    analyze,
    check_trl_site,
    cpu_name,
    interleave,
    print_ratio_table,
    trl_row_inputs,
    trl_version,
    write_report,
)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATA = "embedded:rotten-tomatoes-chat"
TRL_VERSION = "1.16.0"
INSTALL = f'.venv/bin/uv pip install --target /tmp/trl-site "trl=={TRL_VERSION}" --no-deps --python .venv/bin/python'
# ortlab's adapter defaults (AdapterSpec), given to TRL's peft config too: the same adapter on both sides.
LORA = {"rank": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
METHOD = (
    "interleaved slices in shuffled order; each row's slice over the TRL (defaults) row's slice of the same round; "
    "medians with bootstrap 95% intervals; peak memory = each process's VmHWM (ru_maxrss)"
)


def job_spec(data_file: str, opts: argparse.Namespace) -> dict:
    """Notebook 05's job as a RunSpec dict, reading `data_file`; accelerations left at their defaults ('auto'),
    except in the smoke run, which sets fp32: the precision probe on SmolLM2 takes minutes on a busy machine."""
    return {
        "task": "causal-lm",
        "model": {"name": MODEL},
        "data": {"source": data_file, "max_eval_samples": 8},
        "hyper": {
            "max_steps": 1000,  # the slices stop it long before; a LoRA run is never given to the full tuner
            "batch_size": opts.batch_size,
            "learning_rate": 1e-3,
            "max_length": opts.max_length,
            "logging_steps": 5,
            "gradient_checkpointing": opts.child == "ortlab_ckpt",
        },
        "adapter": {"kind": "lora", "rank": LORA["rank"], "alpha": LORA["alpha"], "dropout": LORA["dropout"]},
        "accel": {"precision": "fp32"} if opts.smoke or opts.child == "ortlab_fp32" else {},
    }


# --- the rows (each its own process) ---------------------------------------------------------------------------


def ortlab_child(opts: argparse.Namespace) -> None:
    from ortlab.fit import check_model_and_data
    from ortlab.lifecycle.assemble import build_trainer, load_model_and_data
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec
    from ortlab.tune import decide, slice_callback

    spec = RunSpec.parse(job_spec(opts.data_file, opts))
    run = RunDir.create(opts.out, spec)
    log = lambda message: print(f"[ortlab] {message}", file=sys.stderr, flush=True)  # noqa: E731
    model_path, prepared = check_model_and_data(spec, log)
    loaded = load_model_and_data(spec, model_path, prepared, log)
    choice, _, why = decide(
        loaded.spec,
        model_path=model_path,
        label_names=prepared.label_names,
        train_dataset=loaded.train_ds,
        collate=loaded.collate,
        progress=log,
        log_dir=run.path / "logs",
        model=loaded.model,
    )
    log(f"auto: {choice} ({why})")
    trainer = build_trainer(loaded, run, choice, False, None, [], log)
    step = lambda: (trainer._step_counters["loss"], trainer._step_counters["samples"])  # noqa: E731

    def applied():
        return {k: v.applied for k, v in trainer.accelerations.items() if v.requested}, why

    trainer.add_callback(slice_callback(False, opts.warmup, step, applied))
    trainer.train()


def trl_child(opts: argparse.Namespace, bf16_default: bool, checkpointing_default: bool = True) -> None:
    from peft import LoraConfig

    from ortlab.tune import slice_callback

    trl, tokenizer, model, dataset = trl_row_inputs(opts.trl_site, MODEL, opts.data_file)

    job = {  # the job's own settings; everything else is SFTConfig's default
        "output_dir": opts.out,
        "per_device_train_batch_size": opts.batch_size,
        "learning_rate": 1e-3,
        "max_length": opts.max_length,
        "max_steps": 1000,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "use_cpu": True,
    }
    if not bf16_default:
        job["bf16"] = False
    if not checkpointing_default:
        job["gradient_checkpointing"] = False
    config = trl.SFTConfig(**job)
    lora = LoraConfig(
        r=LORA["rank"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        target_modules=LORA["target_modules"],
        task_type="CAUSAL_LM",
    )
    trainer = trl.SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora
    )
    print(
        f"[trl {trl.__version__}] bf16={config.bf16} gradient_checkpointing={config.gradient_checkpointing} "
        f"packing={config.packing} padding_free={config.padding_free}",
        file=sys.stderr,
        flush=True,
    )
    step = lambda: (float("nan"), opts.batch_size)  # noqa: E731  (no packing: every step is one full batch)

    def applied():
        return {"bf16": bool(config.bf16), "gradient_checkpointing": bool(config.gradient_checkpointing)}, None

    trainer.add_callback(slice_callback(False, opts.warmup, step, applied))
    trainer.train()


# --- the driver ----------------------------------------------------------------------------------------------


def write_data(folder: Path, examples: int) -> Path:
    """The first `examples` conversations of the embedded chat data, as the one JSONL file both sides read."""
    from ortlab.assets import embedded_dataset

    source, _ = embedded_dataset(DATA.removeprefix("embedded:"))
    lines = source.read_text(encoding="utf-8").splitlines()[:examples]
    out = folder / "train.jsonl"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-site", default=os.environ.get("ORTLAB_TRL_SITE"), help="folder trl was installed into")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--examples", type=int, default=400, help="conversations both sides read")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (each row trains --slice steps)")
    p.add_argument("--slice", type=int, default=1, help="steps per row per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-trl-fp32", action="store_true", help="leave out the TRL row with bf16=False")
    p.add_argument("--equal", action="store_true", help="add trl_equal and ortlab_fp32: memory at equal settings")
    p.add_argument("--checkpointing", action="store_true", help="add ortlab_ckpt: ortlab with gradient checkpointing")
    p.add_argument(
        "--smoke", action="store_true", help="batch 2, 2 rounds, fp32 (no probe): checks the script, not speed"
    )
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/lora-trl-<date>.json)")
    p.add_argument("--note", default=None, help="written into the result, e.g. the machine's load")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child in ("ortlab", "ortlab_fp32", "ortlab_ckpt"):
        ortlab_child(opts)
        return
    if opts.child in ("trl", "trl_fp32", "trl_equal"):
        trl_child(opts, bf16_default=opts.child == "trl", checkpointing_default=opts.child != "trl_equal")
        return
    opts.trl_site = check_trl_site(opts.trl_site, "bench_lora_trl", INSTALL)
    if opts.smoke:
        opts.batch_size, opts.examples = 2, 40
        opts.rounds, opts.warmup, opts.no_trl_fp32 = 2, 1, True

    from ortlab.accel import package_version, tcmalloc
    from ortlab.envvars import child_env
    from ortlab.tasks import resolve_model
    from ortlab.tune import Stepper

    print("[bench] the embedded SmolLM2 (converted once from its GGUF) ...", flush=True)
    resolve_model(MODEL)  # made here, once, so no row pays (or races for) the conversion
    rows = ["trl", "ortlab"] + ([] if opts.no_trl_fp32 else ["trl_fp32"])
    rows += ["trl_equal", "ortlab_fp32"] if opts.equal else []
    rows += ["ortlab_ckpt"] if opts.checkpointing else []
    print(f"[bench] {len(rows)} processes: {', '.join(rows)}", flush=True)
    results: dict[str, dict] = {name: {"mix": name} for name in rows}
    with tempfile.TemporaryDirectory(prefix="ortlab-bench-trl-") as tmp:
        data_file = write_data(Path(tmp), opts.examples)
        procs = {}
        for name in rows:
            out = f"{tmp}/{name}"
            cmd = [sys.executable, __file__, "--child", name, "--data-file", str(data_file), "--out", out]
            cmd += ["--trl-site", opts.trl_site, "--warmup", str(opts.warmup)]
            cmd += ["--batch-size", str(opts.batch_size), "--max-length", str(opts.max_length)]
            cmd += ["--smoke"] if opts.smoke else []
            # ortlab's rows start with the allocator a launched ortlab run gets (tcmalloc where it is installed);
            # TRL's with glibc's malloc, what a TRL user runs
            env = tcmalloc.process_env(child_env(), on=name.startswith("ortlab") and tcmalloc.wanted("auto"))
            procs[name] = Stepper(cmd, Path(f"{out}.log"), env=env)
        measure_time = interleave(
            procs,
            results,
            warmup=opts.warmup,
            rounds=opts.rounds,
            slice_steps=opts.slice,
            baseline="trl",
            baseline_what="TRL's SFTTrainer",
        )
        for name in rows:  # what each side said about its settings (the auto decision, TRL's defaults)
            log = Path(f"{tmp}/{name}.log").read_text(errors="replace").splitlines()
            results[name]["said"] = [ln[:300] for ln in log if ln.startswith(("[ortlab] auto", "[trl "))]
    analyze(results, baseline="trl")
    report = {
        "benchmark": "bench_lora_trl",
        "method": METHOD,
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "model": MODEL + " (embedded)",
        "data": f"{DATA}, first {opts.examples} conversations",
        "adapter": LORA,
        "batch_size": opts.batch_size,
        "max_length": opts.max_length,
        "rounds": opts.rounds,
        "slice_steps": opts.slice,
        "warmup_steps": opts.warmup,
        "measure_time_s": measure_time,
        "smoke": opts.smoke,
        "note": opts.note,
        "packages": {d: package_version(d) for d in ("torch", "transformers", "peft")}
        | {"trl": trl_version(opts.trl_site)},
        "results": list(results.values()),
    }
    name = f"lora-trl-{date.today().isoformat()}{'-smoke' if opts.smoke else ''}.json"
    path = write_report(report, opts.output, name)
    print_ratio_table(report)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
