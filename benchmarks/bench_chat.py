"""Chat data on the embedded small LLM: does packing train faster, and does a short LoRA run change what it says?

    .venv/bin/python benchmarks/bench_chat.py                          # CPU: SmolLM2-135M-Instruct, both parts
    .venv/bin/python benchmarks/bench_chat.py --part packing --steps 20
    .venv/bin/python benchmarks/bench_chat.py --part score --lora-steps 60 --device cuda   # same command on a GPU

Part `packing`: the same Rotten Tomatoes conversations (embedded:rotten-tomatoes-chat, formatted with SmolLM2's
chat template by ortlab's own data path) trained with plain PyTorch AdamW steps, unpacked (batches of
`--batch-size` examples padded to the longest) and packed (rows of `--max-length` tokens, as many examples as fit,
batches of rows), interleaved step by step so a busier machine slows both. Reported: examples/s and assistant
(label) tokens/s of each, and the packed/unpacked ratio, as medians over the steps after the warm-up.

Part `score`: a real ortlab run (LoRA through h-lora's AdapterSpec) on the same data; exact match of the greedy
answer ("fresh"/"rotten") on `--score-examples` held-out conversations before and after training, with the run's
time. Results go to benchmarks/results/chat-<device>-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATA = "embedded:rotten-tomatoes-chat"


def packing_part(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from ortlab.data import collator, load_and_check, tokenize
    from ortlab.spec import RunSpec
    from ortlab.tasks import load_tokenizer, resolve_model

    path = resolve_model(MODEL)
    tokenizer = load_tokenizer(path)
    n = args.batch_size * (args.steps + args.warmup) * 2
    out = {}
    datasets, collates = {}, {}
    for packed in (False, True):
        spec = RunSpec.parse(
            {
                "task": "causal-lm",
                "model": {"name": MODEL},
                "data": {"source": DATA, "max_train_samples": n, "max_eval_samples": 8, "packing": packed},
                "hyper": {"max_length": args.max_length},
            }
        )
        prepared = load_and_check(spec.data, "causal-lm", 0)
        train, _ = tokenize(prepared, tokenizer, "causal-lm", args.max_length)
        datasets[packed], collates[packed] = train, collator("causal-lm", tokenizer, None, prepared)
    per_row = [sum(1 for p in row if p == 0) for row in datasets[True]["position_ids"]]
    rows_per_batch = max(1, round(args.batch_size / statistics.mean(per_row)))
    torch.manual_seed(0)
    models = {k: AutoModelForCausalLM.from_pretrained(path).to(args.device).train() for k in (False, True)}
    for m in models.values():
        m.config.use_cache = False  # as in training: transformers finds the packed examples only without a cache
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-5) for k, m in models.items()}
    times: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
    for step in range(args.steps + args.warmup):
        for packed in (False, True):
            size = rows_per_batch if packed else args.batch_size
            rows = [datasets[packed][i] for i in range(step * size, (step + 1) * size)]
            batch = {k: v.to(args.device) for k, v in collates[packed](rows).items()}
            examples = sum(sum(1 for p in r["position_ids"] if p == 0) for r in rows) if packed else len(rows)
            label_tokens = int((batch["labels"] != -100).sum())
            t0 = time.perf_counter()
            loss = models[packed](**batch).loss
            loss.backward()
            optims[packed].step()
            optims[packed].zero_grad()
            if args.device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if step >= args.warmup:
                times[packed].append((dt, examples, label_tokens))
    for packed in (False, True):
        t = times[packed]
        out["packed" if packed else "unpacked"] = {
            "examples_per_s": statistics.median(e / dt for dt, e, _ in t),
            "label_tokens_per_s": statistics.median(lt / dt for dt, _, lt in t),
            "examples_per_step": statistics.mean(e for _, e, _ in t),
            "step_time_s": statistics.median(dt for dt, _, _ in t),
        }
    out["ratio_examples_per_s"] = out["packed"]["examples_per_s"] / out["unpacked"]["examples_per_s"]
    out["ratio_label_tokens_per_s"] = out["packed"]["label_tokens_per_s"] / out["unpacked"]["label_tokens_per_s"]
    out["settings"] = {
        "batch_size_examples": args.batch_size,
        "packed_rows_per_batch": rows_per_batch,
        "mean_examples_per_packed_row": statistics.mean(per_row),
        "max_length": args.max_length,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    return out


def score_part(args) -> dict:
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    spec = RunSpec.parse(
        {
            "task": "causal-lm",
            "model": {"name": MODEL},
            "data": {"source": DATA, "max_train_samples": args.lora_steps * args.batch_size, "max_eval_samples": 64},
            "hyper": {
                "max_steps": args.lora_steps,
                "batch_size": args.batch_size,
                "learning_rate": args.lora_lr,
                "max_length": args.max_length,
                "logging_steps": 5,
            },
            "adapter": {"kind": "lora", "rank": 8},
            "generation": {"num_prompts": 4, "score_examples": args.score_examples, "max_new_tokens": 4},
            "accel": {"tune": "off", "ort": False},
            "output_dir": tempfile.mkdtemp(prefix="bench-chat-"),
        }
    )
    started = time.monotonic()
    result = train_spec(spec, progress=False, log=lambda s: print(s, flush=True))
    return {
        "exact_match_before": result["eval_before"].get("eval_exact_match"),
        "exact_match_after": result["eval_after"].get("eval_exact_match"),
        "eval_loss_before": result["eval_before"].get("eval_loss"),
        "eval_loss_after": result["eval_after"].get("eval_loss"),
        "score_examples": args.score_examples,
        "steps": args.lora_steps,
        "batch_size": args.batch_size,
        "learning_rate": args.lora_lr,
        "adapter": result.get("adapter"),
        "train_time_s": result["summary"].get("train_time_s"),
        "steady_samples_per_s": result["summary"].get("steady_samples_per_s"),
        "wall_time_s": time.monotonic() - started,
        "run_dir": result["run_dir"],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=("packing", "score", "both"), default="both")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--lora-steps", type=int, default=40)
    p.add_argument("--lora-lr", type=float, default=1e-3)
    p.add_argument("--score-examples", type=int, default=48)
    args = p.parse_args()
    out = {"model": MODEL, "data": DATA, "device": args.device, "machine": platform.processor() or platform.machine()}
    if args.part in ("packing", "both"):
        out["packing"] = packing_part(args)
        print(json.dumps(out["packing"], indent=2), flush=True)
    if args.part in ("score", "both"):
        out["lora_score"] = score_part(args)
        print(json.dumps(out["lora_score"], indent=2), flush=True)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    path = results / f"chat-{args.device}-{date.today()}-{args.part}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
