"""The CUDA path, tested on CPU where it can be: the FLOP count against a hand count, the GPU peak table, the
per-step device numbers. Tests marked `cuda` need a GPU and skip elsewhere with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortlab.flops import count_parameters, flops_per_sample, matmul_precision, peak_flops

needs_cuda = pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (none is visible on this machine)"
)


def _bert(**kw):
    from transformers import BertConfig, BertForSequenceClassification

    c = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    c.update(max_position_embeddings=64, num_labels=3, **kw)
    return BertForSequenceClassification(BertConfig(**c))


def _llama(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config)


def test_bert_flops_match_a_hand_count():
    model = _bert()
    V, h, L, inner, P, C = 100, 32, 2, 48, 64, 3
    # Every parameter but the three input embeddings: embeddings' LayerNorm, per layer Q/K/V/O with biases, two
    # LayerNorms, the feed-forward pair with biases; the pooler; the classifier.
    layer = 4 * (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h) + 2 * h
    n = 2 * h + L * layer + (h * h + h) + (h * C + C)
    shape = count_parameters(model)
    assert shape.embedding_params == V * h + P * h + 2 * h
    assert shape.matmul_params == n == shape.trainable_matmul_params
    s = 16
    assert flops_per_sample(shape, s) == 6 * n * s + 12 * L * h * s * s


@pytest.mark.parametrize("tie", [True, False])
def test_llama_flops_match_a_hand_count_tied_or_not(tie):
    V, h, inner, L, heads, kv = 120, 32, 40, 3, 4, 2
    kv_dim = kv * (h // heads)
    # q and o are h x h, k and v h x kv_dim (grouped-query attention), no biases; gate/up/down; two RMSNorms per
    # layer, the final norm; the LM head multiplies by a (vocab x hidden) matrix whether tied or not.
    n = L * (2 * h * h + 2 * h * kv_dim + 3 * h * inner + 2 * h) + h + V * h
    model = _llama(tie)
    shape = count_parameters(model)
    assert shape.embedding_params == V * h
    assert shape.matmul_params == n
    s = 64
    assert flops_per_sample(shape, s) == 6 * n * s + 12 * L * h * s * s


def test_frozen_weights_skip_their_weight_gradients():
    model = _llama(tie=False)
    for name, p in model.named_parameters():
        p.requires_grad = "lm_head" in name
    shape = count_parameters(model)
    assert shape.trainable_matmul_params == 120 * 32
    s = 8
    assert flops_per_sample(shape, s) == (4 * shape.matmul_params + 2 * 120 * 32) * s + 12 * 3 * 32 * s * s


@pytest.mark.parametrize(
    ("name", "precision", "gpu", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "tf32", "H100 NVL", 417.5),
        ("NVIDIA H200", "fp16", "H200 SXM", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", "A100", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp32", "A100", 19.5),
        ("NVIDIA L4", "bf16", "L4", 121.0),
        ("NVIDIA L40S", "bf16", "L40S", 362.1),
        ("NVIDIA A10", "fp16", "A10", 125.0),
        ("Tesla T4", "fp16", "T4", 65.0),
        ("NVIDIA GeForce RTX 4090", "bf16", "GeForce RTX 4090", 165.2),
    ],
)
def test_peak_table_lookup(name, precision, gpu, tflops):
    peak = peak_flops(name, precision)
    assert (peak.gpu, peak.flops) == (gpu, tflops * 1e12)


def test_unknown_gpu_cpu_and_missing_precision_give_no_peak_with_the_reason():
    a10g = peak_flops("NVIDIA A10G", "bf16")  # not the A10: a different card, not in the table
    assert a10g.flops is None and "not in ortlab's table" in a10g.reason
    t4 = peak_flops("Tesla T4", "bf16")
    assert t4.flops is None and "no bf16" in t4.reason
    cpu = peak_flops("cpu", "fp32", "cpu")
    assert cpu.flops is None and "no datasheet peak on cpu" in cpu.reason  # ortlab.peak measures one instead
    assert matmul_precision("fp32", tf32=True) == "tf32" and matmul_precision("bf16", tf32=True) == "bf16"


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """Four real training steps of a tiny BERT on CPU, without ORT; the metrics stream it wrote."""
    import torch

    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.trainer import ORTTrainer

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return {"input_ids": torch.arange(12) % 90 + i % 5, "labels": torch.tensor(i % 3)}

    out = tmp_path_factory.mktemp("cpu-run")
    args = ORTTrainingArguments(
        output_dir=str(out), use_ort=False, max_steps=4, per_device_train_batch_size=8, report_to=[],
        save_strategy="no", disable_tqdm=True, logging_steps=100,
    )  # fmt: skip
    trainer = ORTTrainer(model=_bert(), args=args, train_dataset=Data())
    trainer.train()
    return trainer.metrics_records, trainer


def test_cpu_metrics_carry_model_flops_and_mfu_against_the_measured_peak(cpu_run):
    records, trainer = cpu_run
    begin = next(r for r in records if r["event"] == "train_begin")
    assert begin["device"]["type"] == "cpu"
    peak = begin["device"]["mfu"]
    assert peak["source"] == "measured" and peak["flops"] > 0 and "measured here" in peak["reason"], peak
    assert "mfu_datasheet" not in begin["device"], "a CPU has no datasheet peak"
    assert begin["device"]["flops"]["model"]["matmul_params"] == count_parameters(trainer.model).matmul_params
    steps = [r for r in records if r["event"] == "step"]
    assert len(steps) == 4
    expected = 8 * flops_per_sample(count_parameters(trainer.model), 12)
    for s in steps:
        assert s["model_tflops_per_s"] == pytest.approx(expected / s["step_time_s"] / 1e12)
        assert s["mfu"] == pytest.approx(s["model_tflops_per_s"] * 1e12 / peak["flops"])
        assert "mfu_datasheet" not in s and "gpu_mem_reserved_mb" not in s
        assert s["mem_kind"] == "cpu_peak_rss" and s["peak_mem_mb"] > 0


def test_run_summary_has_mfu_and_gpu_memory_where_present():
    from ortlab.runfolder.compare import summarize

    steps = [
        {"event": "step", "step": i, "step_time_s": 1.0 if i > 2 else 5.0, "samples": 8, "tokens": 80,
         "loss": 1.0, "mfu": 0.3 if i == 3 else 0.5, "model_tflops_per_s": 100.0, "peak_mem_mb": 10.0,
         "gpu_mem_step_peak_mb": 900.0 + i, "gpu_mem_reserved_mb": 1024.0}
        for i in range(1, 6)
    ]  # fmt: skip
    summary = summarize(steps, warmup_steps=2)
    assert summary["steady_mfu"] == pytest.approx((0.3 + 0.5 + 0.5) / 3)
    assert summary["max_gpu_mem_step_peak_mb"] == 905.0 and summary["max_gpu_mem_reserved_mb"] == 1024.0
    for s in steps:
        s.pop("mfu")
    assert "steady_mfu" not in summarize(steps, warmup_steps=2)


@pytest.mark.cuda
@needs_cuda
def test_cuda_metrics_records_have_gpu_memory_and_mfu(tmp_path):
    import torch

    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.trainer import ORTTrainer

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"input_ids": torch.arange(32) % 90, "labels": torch.tensor(i % 3)}

    capable = torch.cuda.get_device_capability() >= (8, 0)
    args = ORTTrainingArguments(
        output_dir=str(tmp_path), use_ort=False, max_steps=3, per_device_train_batch_size=16, report_to=[],
        save_strategy="no", disable_tqdm=True, tf32=capable,
    )  # fmt: skip
    trainer = ORTTrainer(model=_bert(), args=args, train_dataset=Data())
    trainer.train()
    assert trainer.accelerations["tf32"].applied == capable, trainer.accelerations["tf32"]
    records = trainer.metrics_records
    begin = next(r for r in records if r["event"] == "train_begin")
    steps = [r for r in records if r["event"] == "step"]
    assert begin["device"]["type"] == "cuda" and begin["device"]["name"] == torch.cuda.get_device_name()
    for s in steps:
        assert s["gpu_mem_allocated_mb"] > 0 and s["gpu_mem_reserved_mb"] >= s["gpu_mem_allocated_mb"]
        assert s["gpu_mem_step_peak_mb"] > 0
        assert s["mem_kind"] == "cuda_max_allocated"
        if begin["device"]["mfu"]["flops"]:
            assert 0 < s["mfu"] < 1
    assert begin["device"]["mfu"]["precision"] == ("tf32" if capable else "fp32")


# --- TF32, attention, compile shapes, data loading ---------------------------------------------------------------


def test_tf32_auto_resolves_off_on_cpu_and_explicit_true_is_refused_before_launch():
    from ortlab.accel.precision import tf32_availability
    from ortlab.spec import RunSpec

    assert not tf32_availability().available and "no CUDA device" in tf32_availability().reason
    spec = RunSpec()
    from ortlab.accel.mix import mix_of, resolve
    from ortlab.runner import RunError, preflight

    assert spec.accel.tf32 == "auto" and resolve(spec.accel).tf32 is False and mix_of(spec).tf32 is False
    with pytest.raises(RunError, match=r"tf32 is not available in .*: TF32 is a tensor-core mode"):
        preflight(RunSpec(accel={"tf32": True}))
    assert mix_of(RunSpec(accel={"tf32": False})).requested()["tf32"] is False


def test_cpu_run_records_tf32_not_applied_and_sdpa_attention(cpu_run):
    records, trainer = cpu_run
    tf32 = trainer.accelerations["tf32"]
    assert (tf32.requested, tf32.applied) == (False, False)
    assert tf32.details["device"] == "cpu" and tf32.details["float32_matmul_precision"] == "highest"
    begin = next(r for r in records if r["event"] == "train_begin")
    assert begin["device"]["attention"] == "sdpa", "ORT's eager attention must not leak into a run without ORT"


def test_ort_needs_eager_attention_only_when_it_trains():
    from ortlab.accel import ort

    model = _bert()
    assert model.config._attn_implementation == "sdpa"
    changes = ort.prepare_model(model)
    assert model.config._attn_implementation == "eager" and "attention" in changes


def test_dataloader_settings_keep_cpu_as_it_was():
    from ortlab.lifecycle.assemble import _dataloader_settings

    assert _dataloader_settings() == {"dataloader_num_workers": 0}


@pytest.mark.slow
def test_compile_pads_lengths_and_does_not_recompile_every_step(tiny_bert, tmp_path):
    """Ten batches of ten lengths under torch.compile (compile runtime, Dynamo's eager backend): padded to multiples
    of 8, and Dynamo compiles at most once more after the first step (its automatic dynamic shapes), recorded."""
    import os
    import subprocess

    from conftest import ROOT

    from ortlab import runtimes

    python = runtimes.python_for("compile") or runtimes.create("compile")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers")])}
    script = ROOT / "tests" / "helpers" / "compile_shapes.py"
    out = subprocess.run(
        [str(python), str(script), str(tiny_bert), str(tmp_path), "8"], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("COMPILE-SHAPES "))
    found = json.loads(line.split(" ", 1)[1])
    assert all(n % 8 == 0 for n in found["lengths"]) and len(set(found["lengths"])) >= 3, found["lengths"]
    record = found["torch_compile"]
    assert record["applied"] and record["details"]["frames_compiled"] >= 1
    assert record["details"]["compiles_after_first_step"] <= 1, record


def test_tf32_is_read_through_the_new_settings_once_they_were_set():
    """torch >= 2.9: after `fp32_precision` was set (transformers' tf32=True does), reading the legacy `allow_tf32`
    raises; the state is read all the same, and says TF32. Seen on an H200 (torch 2.11), where the tf32 and best
    rows of bench_gpu failed on it; it happens on a CPU build too, so it runs here, in the compile runtime's torch."""
    import os
    import subprocess

    from conftest import ROOT

    from ortlab import runtimes

    python = runtimes.python_for("compile") or runtimes.create("compile")
    code = (
        "import json, torch\n"
        "from ortlab.accel.precision import tf32_on, tf32_state\n"
        "from ortlab.peak import _set_tf32\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "on = tf32_state()\n"
        "restore = _set_tf32(torch, False)\n"
        "off = tf32_state()\n"
        "restore()\n"
        "print(json.dumps([tf32_on(on), tf32_on(off), tf32_on(tf32_state()), on]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    on, off, restored, state = json.loads(out.stdout.strip().splitlines()[-1])
    assert (on, off, restored) == (True, False, True), state
    assert state["cuda_matmul_fp32_precision"] == "tf32" and state["cuda_matmul_allow_tf32"] is None, state


# --- the doctor on CUDA: its rows from a probe record ---------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "cuda"


@pytest.fixture
def h100() -> dict:
    """An H100's probe record, CONSTRUCTED from documented properties (see its _provenance), not recorded."""
    data = json.loads((FIXTURES / "h100_probe_constructed.json").read_text())
    assert data.pop("_provenance").startswith("CONSTRUCTED, NOT RECORDED")
    return data


def test_doctor_rows_on_an_h100(h100):
    from ortlab.gpu import findings

    rows = {f.name: f for f in findings(h100)}
    assert rows["cuda"].status == "yes" and "NVIDIA H100 80GB HBM3 (9.0, 79.1 GiB)" in rows["cuda"].reason
    for name in ("fp16", "bf16", "tf32", "sdpa_flash", "sdpa_mem_efficient", "fused_adam", "torch_compile"):
        assert rows[name].status == "yes", rows[name]
    assert "Triton 3.6.0" in rows["torch_compile"].reason
    assert rows["zero1"].status == "no" and "pip install deepspeed" in rows["zero1"].remedy
    assert rows["nvml"].status == "no" and rows["nvml"].remedy == "pip install nvidia-ml-py"
    ort = rows["ort (CUDA)"]
    assert ort.status == "no"
    for needed in ("CPython 3.8-3.11", "torch <= 2.6", "pip install onnxruntime-training==1.19.2",
                   "nvidia-cublas-cu11", "nvidia-cudnn-cu11", "nvcc"):  # fmt: skip
        assert needed in ort.reason, needed
    assert "nvidia-curand-cu11" not in ort.reason, "a library that loads is not listed as missing"
    assert sum(f.status == "not checked" for f in findings(h100)) == 4


def test_doctor_rows_when_kernels_fail_on_an_older_gpu(h100):
    from ortlab.gpu import findings

    h100["devices"][0].update(name="Tesla T4", capability="7.5")
    h100.update(bf16=False, tf32=False)
    h100["sdpa"]["flash"] = {"ok": False, "error": "RuntimeError: No available kernel. Aborting execution."}
    h100["compile"] = {"ok": False, "error": "RuntimeError: Found Tesla T4 which is too old", "triton": None}
    rows = {f.name: f for f in findings(h100)}
    assert rows["bf16"].status == "no" and rows["bf16"].remedy == "use fp16 on this GPU"
    assert rows["tf32"].status == "no" and "7.5" in rows["tf32"].reason
    assert rows["sdpa_flash"].status == "no" and "No available kernel" in rows["sdpa_flash"].reason
    assert rows["torch_compile"].status == "no" and "Triton is not installed" in rows["torch_compile"].reason


def test_ort_on_cuda_is_never_claimed_even_when_nothing_is_missing():
    from ortlab.gpu import ORT_CUDA11_LIBS, ort_on_cuda

    ready = {
        "python": "3.11.9", "torch": "2.6.0+cu124", "onnxruntime_training": "1.19.2", "ort_cuda_version": "11.8",
        "libs": dict.fromkeys(ORT_CUDA11_LIBS, True), "nvcc": "11.8", "cuda_extensions": ["torch_gpu_allocator.so"],
    }  # fmt: skip
    assert ort_on_cuda(ready).status == "not checked"
    only_ext = ort_on_cuda({**ready, "cuda_extensions": []})
    assert only_ext.status == "no" and only_ext.reason.count(";") == 0 and "extensions are not built" in only_ext.reason
    cpu_build = ort_on_cuda({**ready, "ort_cuda_version": ""})
    assert "CPU build" in cpu_build.reason


def test_the_cuda_probe_on_this_cpu_machine_says_why_and_the_report_renders(h100):
    from rich.console import Console

    from ortlab.gpu import probe_cuda
    from ortlab.probe import DoctorReport

    here = probe_cuda()
    assert here["available"] is False and here["reason"] and here["count"] == 0
    report = DoctorReport("3.12.3", "python", "Linux", "2.11.0", "13.0", [], {}, {}, gpu=h100)
    again = DoctorReport.from_dict(json.loads(report.to_json()))
    assert again.gpu == h100 and again.to_dict()["gpu_findings"][0]["name"] == "cuda"
    console = Console(width=200, record=True)
    again.render(console)
    text = console.export_text()
    assert "GPU (probed on the device)" in text and "NVIDIA H100 80GB HBM3" in text and "not checked" in text


def test_compare_and_the_model_card_show_mfu_and_gpu_memory(tmp_path):
    """A GPU run's stream (written by hand: no GPU here) next to a CPU run: compare gets an MFU column, the
    card an MFU and a GPU memory line; the CPU run shows '-' rather than a number."""
    from fake_runs import append, make_fake_run, step_record
    from rich.console import Console

    from ortlab import safeio
    from ortlab.publish import model_card
    from ortlab.runfolder.compare import compare, render, summarize
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run

    gpu = RunDir(make_fake_run(tmp_path, "gpu-run", steps=0))
    steps = [
        {**step_record(i), "mfu": 0.31, "model_tflops_per_s": 306.7, "gpu_mem_step_peak_mb": 9000.0 + i,
         "gpu_mem_reserved_mb": 12288.0, "mem_kind": "cuda_max_allocated"}
        for i in range(1, 8)
    ]  # fmt: skip
    append(gpu.metrics_path, *steps)
    summary = summarize([{"event": "train_begin"}, *steps])
    safeio.write_json(gpu.path, "result.json", {"summary": summary, "eval_after": {"eval_accuracy": 0.8}})
    cpu = make_fake_run(tmp_path, "cpu-run")
    rows = compare([Run(cpu), Run(gpu.path)])
    assert rows[1].summary["steady_mfu"] == pytest.approx(0.31) and "steady_mfu" not in rows[0].summary
    console = Console(width=250, record=True)
    render(rows, console)
    text = console.export_text()
    assert "MFU" in text and "31.0%" in text
    card = model_card(Run(gpu.path))
    assert "model FLOPs utilisation (MFU): 31.0%" in card and "reserved 12288 MB" in card
    assert "MFU" not in model_card(Run(cpu))


def test_a_run_without_ort_gets_torchs_fused_adamw_on_cuda_too():
    import torch

    from ortlab.accel.fused_adam import TORCH_NAME, optimizer_cls_and_kwargs

    # Without ORT the CUDA branch never tries ORT's FusedAdam (so this runs on a CPU machine as well).
    assert optimizer_cls_and_kwargs("cuda", with_ort=False) == (torch.optim.AdamW, {"fused": True}, TORCH_NAME)
