"""GGUF export parity on the embedded SmolLM2-135M-Instruct after a LoRA run (issue #46's acceptance).

    .venv/bin/python benchmarks/bench_gguf.py                     # trains a short LoRA run, then exports
    .venv/bin/python benchmarks/bench_gguf.py --run PATH          # exports an existing completed causal-LM run

Trains LoRA (rank 8) on embedded:rotten-tomatoes-chat for a few steps, exports f16, bf16 and q8_0 with
`ortlab.export.export_gguf` (each file read back by transformers and held against the trained fp32 model on 20
held-out conversations: greedy continuations, logits), and writes the table and file sizes to
benchmarks/results/gguf-<date>.json. The file of record is the run's own gguf/export.json; this keeps a copy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import write_report  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATA = "embedded:rotten-tomatoes-chat"


def train(steps: int) -> str:
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    spec = RunSpec.parse(
        {
            "name": "smol-lora",
            "task": "causal-lm",
            "model": {"name": MODEL},
            "data": {"source": DATA, "max_train_samples": steps * 4, "max_eval_samples": 20},
            "hyper": {
                "max_steps": steps,
                "batch_size": 4,
                "learning_rate": 2e-3,
                "max_length": 128,
                "logging_steps": 1,
            },
            "adapter": {"kind": "lora", "rank": 8},
            "generation": {"num_prompts": 2, "score_examples": 0, "max_new_tokens": 4},
            "accel": {"tune": "off", "ort": False, "precision": "fp32"},
            "output_dir": tempfile.mkdtemp(prefix="bench-gguf-"),
        }
    )
    return train_spec(spec, progress=False, log=lambda s: print(s, flush=True))["run_dir"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", help="a completed causal-LM run folder (default: train one)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--quant", nargs="+", default=["f16", "bf16", "q8_0"])
    args = p.parse_args()
    from ortlab.export import export_gguf

    run = args.run or train(args.steps)
    started = time.monotonic()
    report = export_gguf(run, quant=args.quant, prompts=args.prompts)
    out = {
        "model": MODEL,
        "data": DATA,
        "run_dir": str(run),
        "export_time_s": round(time.monotonic() - started, 1),
        "good": report.good,
        "reader": report.reader,
        "prompts_from": report.prompts_from,
        "max_new_tokens": report.max_new_tokens,
        "modelfile": report.modelfile,
        "table": [
            {
                "type": q,
                "file": v.file,
                "size_mib": round(v.size_bytes / 2**20, 1),
                "tensor_types": v.tensor_types,
                "prompts_identical": f"{v.prompts_identical}/{v.prompts}",
                "differ": v.differ,
                "max_abs_logit_diff": v.max_abs_logit_diff,
                "mean_abs_logit_diff": v.mean_abs_logit_diff,
                "next_token_agreement": v.next_token_agreement,
                "tolerance": v.tolerance,
                "tokenizer_identical": f"{v.tokenizer_identical}/{v.prompts}",
                "good": v.good,
            }
            for q, v in report.variants.items()
        ],
        "other_readers": report.other_readers,
    }
    model_safetensors = Path(run) / "model" / "merged" / "model.safetensors"
    if model_safetensors.is_file():
        out["merged_fp32_safetensors_mib"] = round(model_safetensors.stat().st_size / 2**20, 1)
    print(json.dumps(out, indent=2))
    print(f"wrote {write_report(out, None, f'gguf-{date.today()}.json')}")


if __name__ == "__main__":
    main()
