"""The estimator's figures on paper for the GPU list (`ortlab.estimator.gpus`): no GPU is used, nothing trains.

    .venv/bin/python benchmarks/estimate_gpus.py        # -> benchmarks/results/estimate-gpus-<date>.json

Two models, each full and with LoRA, on T4, L4, A10G, A100 40/80 GB, H100 SXM and H200, calibration off (the
defaults as shipped): predicted peak memory per GPU (the allocator's, the CUDA context apart), whether it fits,
seconds per step and for 1,000 steps.

- SmolLM2-135M-Instruct (the embedded model) at batch 16 x 512 on the embedded chat rows, the run measured once
  on an H200 (benchmarks/results/gpu-session-2026-11-28-h200.json: 0.32 s a step full, 0.29 s LoRA). Its steps are
  nearly all overhead, so every GPU predicts about the same: the step model's per-layer overhead comes from that one
  run.
- SmolLM2-1.7B by its published config (written here: hidden 2048, 24 layers, MLP 8192, 32 heads, vocabulary
  49,152, tied embeddings; the estimator reads a config, never weights) at batch 8 x 1024 of Hamlet's text, without
  checkpointing: a run whose matmuls and activations decide, where the GPUs differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import write_report  # noqa: E402

SMOLLM2_1_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
}


def specs(folder_1_7b: Path) -> dict[str, dict]:
    small = {
        "task": "causal-lm",
        "model": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct"},
        "data": {"source": "embedded:rotten-tomatoes-chat"},
        "hyper": {"batch_size": 16, "max_length": 512, "max_steps": 1000},
    }
    large = {
        "task": "causal-lm",
        "model": {"name": str(folder_1_7b)},
        "data": {"source": "embedded:hamlet"},
        "hyper": {"batch_size": 8, "max_length": 1024, "max_steps": 1000},
    }
    out = {}
    for name, spec in (("smollm2-135m b16x512", small), ("smollm2-1.7b b8x1024", large)):
        out[f"{name} full"] = spec
        out[f"{name} lora"] = {**spec, "adapter": {"kind": "lora"}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where to write the JSON (default benchmarks/results/estimate-gpus-<date>.json)")
    args = parser.parse_args()
    from ortlab.estimator import estimate
    from ortlab.estimator.gpus import GPUS

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="estimate-gpus-") as tmp:
        folder = Path(tmp) / "smollm2-1.7b"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(SMOLLM2_1_7B))
        for name, spec in specs(folder).items():
            print(name)
            for card in GPUS:
                est = estimate(spec, device=card.name, calibrated=False)
                row = {
                    "precision": est.precision,
                    "peak_mem_gb": round(est.peak.value / 1024, 2),
                    "available_gb": round((est.available_mb or 0) / 1024, 1),
                    "fits": est.fits,
                    "step_s": round(est.step.value, 3),
                    "step_range_s": [round(est.step.low, 3), round(est.step.high, 3)],
                    "hours_for_1000_steps": round(est.total.value / 3600, 2) if est.total else None,
                    "mfu_flops_per_step": est.mfu_flops,
                }
                rows.setdefault(name, {})[card.name] = row
                fits = "" if row["fits"] else " (does not fit)"
                print(
                    f"  {card.name:10s} {row['precision']:5s} peak {row['peak_mem_gb']:6.2f} GB of "
                    f"{row['available_gb']:5.1f}{fits:16s} step {row['step_s']:6.3f} s"
                )
    report = {
        "date": date.today().isoformat(),
        "what": "ortlab.estimator's predictions on paper for the GPU list (defaults, no calibration, no GPU used)",
        "notes": [
            "SmolLM2-135M's step is nearly all overhead: its per-layer overhead comes from one H200 run (2026-11-28)",
            "SmolLM2-1.7B: its published config only; peaks from the GPUs' datasheets (ortlab.estimator.gpus)",
        ],
        "rows": rows,
    }
    path = write_report(report, args.out, f"estimate-gpus-{report['date']}.json")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
