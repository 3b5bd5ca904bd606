"""A causal LM exported with its KV cache: one graph for prefill and decode, greedy generations equal to PyTorch's,
the parity in the export report, `OnnxGenerator`'s streaming and sampling, and the old no-cache graph still there.

The model is the suite's tiny Llama (GQA, tied embeddings: the shape of the embedded SmolLM2), copied into a run
folder marked completed, so no training runs here; the benchmark (benchmarks/bench_onnx_kv.py) runs SmolLM2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec


def completed_run(root: Path, model: Path, name: str) -> Path:
    """A run folder with `model` as its trained model, marked completed (what export needs, without training)."""
    spec = RunSpec.parse(
        {
            "name": name,
            "task": "causal-lm",
            "model": {"name": str(model)},
            "data": {"source": "embedded:hamlet", "max_train_samples": 40, "max_eval_samples": 200},
            "hyper": {"max_length": 32},
            "generation": {"max_new_tokens": 12},
        }
    )
    run = RunDir.create(root, spec)
    shutil.copytree(model, run.model_dir, dirs_exist_ok=True)
    run.set_status("completed")
    return run.path


@pytest.fixture(scope="module")
def exported(tiny_llama, tmp_path_factory) -> tuple[Path, object]:
    from ortlab.export import export_onnx

    run = completed_run(tmp_path_factory.mktemp("kv-runs"), tiny_llama, "kv")
    return run, export_onnx(run, samples=16, quantize=True)


def test_the_cache_graph_takes_and_returns_past_key_values(exported):
    import onnxruntime as ort

    run, _ = exported
    session = ort.InferenceSession(str(run / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs[3:] == [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{i}.{k}" for i in range(2) for k in ("key", "value")]
    for name in ("config.json", "generation_config.json", "tokenizer.json"):  # a generation loop needs no run
        assert (run / "onnx" / name).is_file(), name


def test_export_report_has_generation_parity_and_per_token_latency(exported):
    from ortlab.export import MAX_ABS_DIFF

    run, report = exported
    assert report.good
    fp32 = report.variants["fp32"]
    assert fp32.max_abs_diff < MAX_ABS_DIFF  # the whole sequence as a prefill, against PyTorch's logits
    assert fp32.agreement == 1.0
    assert fp32.generation_agreement == 1.0  # every greedy generation token for token
    assert fp32.latency_ms["per_token"] > 0 and report.pytorch_latency_ms["per_token"] > 0
    assert report.generation["kv_cache"] is True and report.generation["inputs"] == 8
    assert report.variants["int8"].agreement >= 0.9
    saved = json.loads((run / "onnx" / "export.json").read_text())
    assert saved["good"] is True
    assert saved["variants"]["fp32"]["generation_agreement"] == 1.0


def test_prefill_then_steps_equal_pytorch_logits(exported, tiny_llama):
    """Decoding token by token through the cache gives PyTorch's logits for the whole sequence at each step."""
    import torch
    from transformers import AutoModelForCausalLM

    from ortlab.export.kvgen import OnnxGenerator

    run, _ = exported
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    generator = OnnxGenerator(run / "onnx")
    assert generator.uses_cache
    prompt = [5, 17, 42, 7, 99]
    steps = generator._steps_cached(prompt)
    logits, sequence = next(steps), list(prompt)
    for token in (3, 11, 250, 8):
        with torch.no_grad():
            expected = model(torch.tensor([sequence])).logits[0, -1].numpy()
        assert np.abs(logits - expected).max() < 1e-4
        sequence.append(token)
        logits = steps.send(token)


def test_greedy_stream_equals_generate_and_stops_at_eos(exported, tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    from ortlab.export.kvcache import greedy_config
    from ortlab.export.kvgen import OnnxGenerator

    run, _ = exported
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    generator = OnnxGenerator(run / "onnx")
    prompt = [1, 30, 31, 32]
    config = greedy_config(model, 20)
    config.eos_token_id = None  # run the full length: a random tiny model rarely says EOS
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), generation_config=config)[0].tolist()
    assert generator.generate(prompt, 20, eos_token_id=[]) == expected
    # With the 3rd generated token as the end token, the stream ends right after yielding it.
    new = expected[len(prompt) :]
    third = new[2]
    assert list(generator.stream(prompt, 20, eos_token_id=third)) == new[: new.index(third) + 1]


def test_sampling_is_seeded_and_top_p_narrows_it(exported):
    from ortlab.export.kvgen import GenerationError, OnnxGenerator

    run, _ = exported
    generator = OnnxGenerator(run / "onnx")
    prompt = [1, 30, 31, 32]
    hot = [list(generator.stream(prompt, 10, temperature=5.0, seed=s, eos_token_id=[])) for s in (1, 1, 2)]
    assert hot[0] == hot[1] and hot[0] != hot[2]
    greedy = list(generator.stream(prompt, 10, eos_token_id=[]))
    # top_p this small keeps only the most likely token: sampling then equals greedy decoding, whatever the seed.
    assert list(generator.stream(prompt, 10, temperature=5.0, top_p=1e-9, seed=3, eos_token_id=[])) == greedy
    with pytest.raises(GenerationError, match="top_p"):
        list(generator.stream(prompt, 3, top_p=0))
    with pytest.raises(GenerationError, match="export the run first"):
        OnnxGenerator(run)


def test_cache_false_keeps_the_old_graph_and_the_generator_drives_both(exported, tmp_path):
    import onnxruntime as ort

    from ortlab.export import export_onnx
    from ortlab.export.kvgen import OnnxGenerator

    run, _ = exported
    copy = tmp_path / "nocache"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("onnx"))
    report = export_onnx(copy, samples=8, cache=False)
    assert report.good and report.generation is None
    session = ort.InferenceSession(str(copy / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    plain, cached = OnnxGenerator(copy / "onnx"), OnnxGenerator(run / "onnx")
    assert not plain.uses_cache
    prompt = [1, 30, 31, 32]
    assert plain.generate(prompt, 15, eos_token_id=[]) == cached.generate(prompt, 15, eos_token_id=[])


def test_gpt2_exports_with_its_cache_too(tiny_gpt2, tmp_path):
    """Another architecture's cache (GPT-2: learned positions, no GQA) through the same wrapper."""
    from ortlab.export import export_onnx

    run = completed_run(tmp_path, tiny_gpt2, "gpt2")
    report = export_onnx(run, samples=8)
    assert report.good, report.to_dict()
    assert report.variants["fp32"].generation_agreement == 1.0


def test_bench_onnx_kv_smoke(tmp_path):
    """benchmarks/bench_onnx_kv.py end to end on a tiny Llama: every row, paired ratios, greedy parity per row."""
    import subprocess

    from conftest import PYTHON, ROOT

    out = tmp_path / "kv.json"
    proc = subprocess.run(
        [PYTHON, str(ROOT / "benchmarks" / "bench_onnx_kv.py"), "--smoke", "--int8", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "bench_onnx_kv" and report["smoke"] is True
    assert set(report["rows"]) == {"pytorch", "pytorch@2", "onnx-nocache", "onnx-kv", "onnx-kv-int8"}
    for name, row in report["rows"].items():
        assert len(row["slices"]) == report["rounds"] and row["tokens_per_s"] > 0, name
        assert row["throughput_ratio"] > 0 and len(row["ratio_ci95"]) == 2, name
    for name in ("pytorch@2", "onnx-nocache", "onnx-kv"):  # fp32 rows: PyTorch's greedy tokens exactly
        assert report["rows"][name]["greedy_equal_share"] == 1.0, name
    assert report["rows"]["onnx-kv"]["prompt_logits_max_abs_diff"] < 1e-4
    assert report["rows"]["onnx-kv-int8"]["prompt_logits_max_abs_diff"] > 0  # int8 changes the numbers
    assert isinstance(report["goal_met"], bool)


def test_cli_export_with_and_without_the_cache(exported, tmp_path):
    import os
    import subprocess

    from conftest import PYTHON

    run, _ = exported
    ortlab = str(Path(PYTHON).parent / "ortlab")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "250"}
    copy = tmp_path / "cli"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("onnx"))
    proc = subprocess.run([ortlab, "export", str(copy), "--samples", "8"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "per token = greedy generation of 12 tokens, 8 prompts" in proc.stdout
    assert "generated: 100% equal" in proc.stdout and "per token" in proc.stdout
    proc = subprocess.run(
        [ortlab, "export", str(copy), "--samples", "8", "--no-cache"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "per token" not in proc.stdout
    assert not json.loads((copy / "onnx" / "export.json").read_text())["generation"]
