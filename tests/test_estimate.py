"""`ortlab.estimator`: a run's memory, time and cost from its spec alone; checked against torch's own record of what
a backward pass keeps, against a real run, and against published GPU figures; the refusal before any model loads;
the CLI; the calibration file (bounded, this machine's only, validated)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PYTHON

from ortlab.estimator import EstimateError, calibration, estimate
from ortlab.estimator.gpus import GPUS, gpu
from ortlab.estimator.memory import CPU_BACKWARD, Setup, activation_bytes
from ortlab.estimator.model import read_model
from ortlab.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of its own: the calibration written here is not the session's."""
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def bert_spec(folder: Path, **hyper) -> RunSpec:
    return RunSpec.parse(
        {
            "model": {"name": str(folder)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 64, "max_eval_samples": 16},
            "hyper": {"batch_size": 8, "max_length": 64, "max_steps": 4, **hyper},
            "accel": {"precision": "fp32", "tune": "off"},
        }
    )


# --- the formulas against what torch does ---------------------------------------------------------------------


def test_parameter_count_is_the_loaded_models(tiny_bert, tiny_llama):
    from transformers import AutoModel, AutoModelForCausalLM

    bert = AutoModel.from_pretrained(tiny_bert)
    assert read_model(str(tiny_bert)).params == sum(p.numel() for p in bert.parameters())
    llama = AutoModelForCausalLM.from_pretrained(tiny_llama)
    facts = read_model(str(tiny_llama))
    assert facts.params == sum(p.numel() for p in llama.parameters())  # the tied head counted once
    assert facts.tied and facts.matmul_params(lm_head=True) == facts.params - facts.embedding_params + facts.vocab * 64


def _saved_bytes(model, inputs) -> int:
    """What the forward pass keeps for the backward one, by torch's own hooks (parameters left out)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    return sum(seen.values())


@pytest.mark.parametrize(("batch", "seq"), [(8, 64), (4, 128), (2, 32)])
def test_activation_formula_matches_what_the_backward_pass_keeps(tiny_bert, tiny_llama, batch, seq):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    models = ((tiny_bert, AutoModelForSequenceClassification, False), (tiny_llama, AutoModelForCausalLM, True))
    for folder, cls, lm in models:
        model = cls.from_pretrained(folder)
        model.train()
        facts = read_model(str(folder))
        ids = torch.randint(5, facts.vocab - 1, (batch, seq), generator=torch.Generator().manual_seed(0))
        labels = ids if lm else torch.zeros(batch, dtype=torch.long)
        measured = _saved_bytes(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
        setup = Setup("cpu", "fp32", batch, seq, facts.params, 1, 0, "for-loop", False, False, lm, 2)
        kept, logits = activation_bytes(facts, setup)
        # (CPU_BACKWARD is what the backward pass holds beyond the saved tensors, in RSS: not in the hooks' count);
        # of the head's three copies, the forward pass keeps one (the log-softmax)
        predicted = kept / CPU_BACKWARD["glibc"] + logits / 3
        assert predicted == pytest.approx(measured, rel=0.15), (folder.name, batch, seq)


def test_memory_terms_add_up_and_follow_the_mix(tiny_llama, cache):
    spec = RunSpec.parse(
        {"task": "causal-lm", "model": {"name": str(tiny_llama)}, "data": {"source": "embedded:hamlet"}}
    )
    full = estimate(spec, device="cpu")
    names = [t.name for t in full.memory]
    assert names[:4] == ["runtime", "weights", "gradients", "optimizer state"]
    assert full.peak.value == pytest.approx(sum(t.value for t in full.memory))
    assert full.peak.low < full.peak.value < full.peak.high
    params = full.model["params"]
    assert full.term("optimizer state").value == pytest.approx(params * 8 / 2**20)  # AdamW: 2 fp32 moments
    lora = estimate(spec.model_copy(update={"adapter": spec.adapter.model_copy(update={"kind": "lora"})}), "cpu")
    assert lora.model["trainable"] < params / 10
    assert lora.term("optimizer state").value < full.term("optimizer state").value / 10
    hyper = spec.hyper.model_copy(update={"gradient_checkpointing": True})
    checkpointed = estimate(spec.model_copy(update={"hyper": hyper}), "cpu")
    assert checkpointed.term("activations").value < full.term("activations").value / 1.5
    assert checkpointed.step.value > full.step.value  # one forward more
    zero = RunSpec.parse({**spec.model_dump(mode="json"), "accel": {"zero_stage": 1}, "target": {"processes": 2}})
    sharded = estimate(zero, "cpu")
    assert sharded.term("optimizer state").value == pytest.approx(full.term("optimizer state").value / 2)
    gpu_run = estimate(spec, device="H100 SXM")
    assert "runtime" not in [t.name for t in gpu_run.memory]  # the allocator's peak has no Python in it
    assert gpu_run.term("optimizer temporaries") is None or gpu_run.memory  # (foreach temporaries on CUDA)


def test_the_cpu_peak_follows_the_allocator_the_process_has(tiny_llama, cache):
    """glibc's malloc keeps freed blocks across steps of different lengths, so checkpointing saves little of a CPU
    run's peak RSS under it; tcmalloc does not (bench_estimate's '-glibc' rows). A run predicts for its own process."""
    from ortlab.accel import tcmalloc
    from ortlab.estimator.checked import before_run

    spec = RunSpec.parse(
        {"task": "causal-lm", "model": {"name": str(tiny_llama)}, "data": {"source": "embedded:hamlet"}}
    )
    hyper = spec.hyper.model_copy(update={"gradient_checkpointing": True})
    checked = spec.model_copy(update={"hyper": hyper})
    acts = {
        (alloc, ckpt): estimate(s, "cpu", allocator=alloc).term("activations").value
        for alloc in ("glibc", "tcmalloc")
        for ckpt, s in ((False, spec), (True, checked))
    }
    assert acts["tcmalloc", False] < acts["glibc", False]
    assert acts["tcmalloc", True] < acts["tcmalloc", False] / 1.5  # checkpointing pays under tcmalloc
    assert acts["glibc", True] >= 0.79 * acts["glibc", False]  # and hardly under glibc
    assert estimate(spec, "cpu", allocator="glibc").peak.value > estimate(spec, "cpu", allocator="tcmalloc").peak.value
    launched = estimate(spec, "cpu")  # what a launched run gets here
    assert launched.model["allocator"] == ("tcmalloc" if tcmalloc.wanted("auto") else "glibc")
    assert any("malloc:" in note for note in launched.notes)
    off = RunSpec.parse({**spec.model_dump(mode="json"), "accel": {"tcmalloc": False}})
    assert estimate(off, "cpu").model["allocator"] == "glibc"
    # a run predicts for the allocator its own process has, whatever the spec asks (this test's process: as pytest
    # was started, tcmalloc preloaded or not)
    mine = "tcmalloc" if tcmalloc.loaded() else "glibc"
    assert before_run(spec).model["allocator"] == before_run(off).model["allocator"] == mine


def test_a_step_of_overhead_teaches_no_efficiency(tiny_bert, cache):
    """Where the matmuls are a small share of the step, or the measured step leaves them less time than the peak
    allows, the run's step says nothing reliable about the efficiency: nothing is learned of it."""
    est = estimate(bert_spec(tiny_bert), device="cpu")
    compute, step = est.term("compute").value, est.step.value
    others = step - compute
    if compute >= 0.25 * step:  # a step the matmuls fill: learned, and the measured step gives it back
        assert est.learned(None, step)["efficiency"] == pytest.approx(est.efficiency)
        assert "efficiency" not in est.learned(None, others + compute * est.efficiency / 1.5)  # past the peak
    else:
        assert "efficiency" not in est.learned(None, step * 3)
    small = dataclasses.replace(est, step=dataclasses.replace(est.step, value=compute * 5))
    assert "efficiency" not in small.learned(None, compute * 5)  # compute 20 % of the step: too small a share


def test_the_data_sample_sets_the_padded_length(tiny_bert, cache):
    est = estimate(bert_spec(tiny_bert, max_length=64, batch_size=16), device="cpu")
    assert est.seq_peak <= 64 and est.seq_mean < 64  # Rotten Tomatoes snippets are short: padding follows them
    assert any("rows tokenized" in n for n in est.notes)


# --- the GPU table against published figures ---------------------------------------------------------------


def test_gpus_on_paper_match_their_datasheets():
    # NVIDIA's datasheets (dense, no sparsity): H100 SXM 989.4 TFLOPS bf16 and 80 GB, H200 the same compute and
    # 141 GB, A100 312 TFLOPS bf16 (40/80 GB), L4 121 (242 with sparsity), T4 65 fp16 and no bf16 tensor cores.
    assert gpu("H100 SXM").peak_flops("bf16") == pytest.approx(989.4e12)
    assert gpu("h200").memory_gb == 141 and gpu("H200").peak_flops("bf16") == gpu("H100 SXM").peak_flops("bf16")
    assert gpu("NVIDIA A100-SXM4-80GB").name == "A100 80GB" and gpu("A100 40GB").memory_gb == 40
    assert gpu("A100 80GB").peak_flops("bf16") == pytest.approx(312e12)
    assert gpu("L4").peak_flops("bf16") == pytest.approx(121e12) and gpu("T4").bf16_tflops is None
    assert gpu("Tesla T4").peak_flops("fp16") == pytest.approx(65e12)
    assert {g.name for g in GPUS} >= {"T4", "L4", "A10G", "A100 40GB", "A100 80GB", "H100 SXM", "H200"}
    # the same figures as the MFU table (ortlab.flops), where both list a GPU
    from ortlab.flops import peak_flops

    for name in ("H100 SXM", "A100 80GB", "L4", "T4"):
        assert gpu(name).peak_flops("fp16") == peak_flops(f"NVIDIA {name}", "fp16").flops
    with pytest.raises(EstimateError, match="not in ortlab's table"):
        estimate(RunSpec(), device="Voodoo 2")


def test_a_gpu_estimate_uses_its_memory_and_peak(tiny_llama, cache):
    spec = RunSpec.parse(
        {"task": "causal-lm", "model": {"name": str(tiny_llama)}, "data": {"source": "embedded:hamlet"}}
    )
    t4, h200 = estimate(spec, device="T4"), estimate(spec, device="H200")
    assert t4.precision == "fp16" and h200.precision == "bf16"  # 'auto': the T4 has no bf16 tensor cores
    assert h200.available_mb > 8 * t4.available_mb
    assert t4.term("compute").value > h200.term("compute").value * 10


# --- refusal before loading ---------------------------------------------------------------------------------


def _huge_model(folder: Path) -> Path:
    """A model folder with a Llama-7B-sized config and no weights at all: the estimate needs none."""
    folder.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_run_twice_this_machines_memory_is_refused_before_any_model_loads(tmp_path, monkeypatch, cache):
    import ortlab.lifecycle.assemble
    import ortlab.tasks
    from ortlab.estimator.memory import MB
    from ortlab.runner import RunError, launch

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ortlab.tasks, "load_model", no_loading)
    monkeypatch.setattr(ortlab.lifecycle.assemble, "load_model", no_loading, raising=False)
    folder = _huge_model(tmp_path / "huge")
    spec = RunSpec.parse(
        {
            "task": "causal-lm",
            "model": {"name": str(folder)},
            "data": {"source": "embedded:hamlet"},
            "hyper": {"batch_size": 1, "max_length": 64},
            "output_dir": str(tmp_path / "runs"),
        }
    )
    est = estimate(spec, device="cpu")
    assert est.available_mb is not None
    assert est.peak.low > 2 * est.available_mb or est.peak.low > 64_000  # 7B params x 16 bytes: ~100 GiB
    started = time.monotonic()
    with pytest.raises(RunError) as refused:
        launch(spec)
    message = str(refused.value)
    assert time.monotonic() - started < 30
    assert f"{est.peak.value:,.0f} MiB" in message and "available" in message
    assert "biggest term is optimizer state" in message  # 6.7B x 8 bytes
    remedies = [line for line in message.splitlines() if line.startswith("  - ")]
    assert remedies and "lora" in remedies[0]  # LoRA saves the most here (no gradients, no optimizer state)
    saved = [float(line.rsplit(": ", 1)[1].split(" MiB")[0].replace(",", "")) for line in remedies]
    assert saved == sorted(saved)  # ranked by effect
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was created
    assert MB == 2**20


def test_the_check_can_be_skipped_and_never_blocks_what_it_cannot_estimate(tmp_path, monkeypatch, cache):
    from ortlab.estimator.fits import check

    folder = _huge_model(tmp_path / "huge")
    spec = {"task": "causal-lm", "model": {"name": str(folder)}, "data": {"source": "embedded:hamlet"}}
    monkeypatch.setenv("ORTLAB_ESTIMATE_CHECK", "0")
    assert check(spec) is None
    monkeypatch.delenv("ORTLAB_ESTIMATE_CHECK")
    assert check({**spec, "model": {"name": "someone/not-here"}}) is None  # a Hub id: no config here, no verdict


# --- faces ---------------------------------------------------------------------------------------------------


def test_estimate_is_fast_and_loads_no_heavy_library(tiny_bert, cache):
    code = (
        "import json, sys, time; t = time.process_time(); import ortlab; "
        f"e = ortlab.estimate({{'model': {{'name': {str(tiny_bert)!r}}}}}, device='cpu'); "
        "print(json.dumps({'cpu_s': time.process_time() - t, 'peak': e.peak.value, "
        "'heavy': [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [] and result["peak"] > 0
    assert result["cpu_s"] < 3  # CPU seconds: the wall clock of a shared machine is not the estimator's


def test_cli_prints_a_table_within_80_columns(tiny_bert, cache):
    from typer.testing import CliRunner

    from ortlab.cli import app

    result = CliRunner().invoke(
        app, ["estimate", "--model", str(tiny_bert), "--batch-size", "8", "--price-per-hour", "2", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    for row in ("weights", "optimizer state", "activations", "peak", "step", "whole run", "cost"):
        assert any(line.startswith(row) for line in lines), row
    as_json = CliRunner().invoke(app, ["estimate", "--model", str(tiny_bert), "--device", "A10G", "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["device"] == "A10G"
    wrong = CliRunner().invoke(app, ["estimate", "--model", str(tiny_bert), "--device", "Voodoo"])
    assert wrong.exit_code == 2 and "not in ortlab's table" in wrong.output


def test_cost_is_the_time_at_the_price(tiny_bert, cache):
    est = estimate(bert_spec(tiny_bert), device="cpu", price_per_hour=3.6)
    assert est.cost == pytest.approx(est.total.value / 1000)


# --- calibration ----------------------------------------------------------------------------------------------


def test_calibration_is_bounded_and_used(tiny_bert, cache):
    spec = bert_spec(tiny_bert)
    before = estimate(spec, device="cpu")
    assert before.term("runtime").basis == "calibrated"  # the shipped constant
    key = before.model["calibration_key"]
    for i in range(calibration.MAX_KEYS + 3):
        calibration.record(f"cpu/other-{i}/fp32", {"efficiency": 0.1})
    for i in range(calibration.KEEP + 5):
        assert calibration.record(key, {"runtime_mb": 500.0 + i, "efficiency": 0.2})
    entries = calibration.load()
    assert len(entries) == calibration.MAX_KEYS and key in entries  # the least recently recorded keys made room
    assert "cpu/other-0/fp32" not in entries and f"cpu/other-{calibration.MAX_KEYS + 2}/fp32" in entries
    assert len(entries[key]["runtime_mb"]) == calibration.KEEP
    assert (cache / "estimate" / calibration.FILE).stat().st_size <= calibration.MAX_BYTES
    after = estimate(spec, device="cpu")
    assert after.term("runtime").basis == "measured here"
    assert after.term("runtime").value == pytest.approx(statistics_median([500.0 + i for i in range(5, 13)]))
    assert after.efficiency == pytest.approx(0.2)
    assert not calibration.record(key, {"runtime_mb": -3.0, "efficiency": 40.0})  # out of range: not recorded


def statistics_median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


@pytest.mark.parametrize(
    "damage",
    ["another machine", "a value out of range", "too many values", "not JSON", "a link", "too large"],
)
def test_a_calibration_file_is_trusted_whole_or_not_at_all(cache, damage, tmp_path):
    key = "cpu/encoder/fp32"
    assert calibration.record(key, {"runtime_mb": 900.0})
    path = cache / "estimate" / calibration.FILE
    data = json.loads(path.read_text())
    if damage == "another machine":
        data["machine"] = "0" * 16
    elif damage == "a value out of range":
        data["entries"][key]["runtime_mb"] = [900.0, 1e12]
    elif damage == "too many values":
        data["entries"][key]["runtime_mb"] = [900.0] * (calibration.KEEP + 1)
    if damage == "not JSON":
        path.write_text("{")
    elif damage == "a link":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps(data))
        path.unlink()
        path.symlink_to(target)
    elif damage == "too large":
        data["padding"] = "x" * calibration.MAX_BYTES
        path.write_text(json.dumps(data))
    else:
        path.write_text(json.dumps(data))
    assert calibration.load() == {}


def test_a_run_records_its_prediction_against_what_it_measured(tiny_bert, tmp_path, cache):
    """A real run (tiny BERT, a few steps): result.json holds predicted against measured, and this machine's
    calibration learns from it, so the next estimate rests on it."""
    from ortlab.runner import train_spec

    spec = RunSpec.parse({**bert_spec(tiny_bert).model_dump(mode="json"), "output_dir": str(tmp_path / "runs")})
    result = train_spec(spec, progress=False, log=lambda line: None)
    check = result["estimate"]
    memory, step = check["peak_mem_mb"], check["step_time_s"]
    assert memory["measured"] == result["summary"]["peak_mem_mb"] and memory["predicted"] > 0
    assert abs(memory["error"]) < 0.5  # the runtime constant dominates a tiny model: within half
    assert step["measured"] == result["summary"]["steady_step_time_s"] and step["predicted"] > 0
    assert check["recorded"] and "runtime_mb" in check["learned"]
    # the efficiency is learned where the measured step outlasts the predicted non-compute terms (optimizer, per-step
    # cost): a tiny model's step on a quiet machine may not, and then nothing is learned of it
    assert 0 < check["learned"].get("efficiency", 0.5) <= 1.5, check["learned"]
    stored = json.loads((Path(result["run_dir"]) / "result.json").read_text())
    assert stored["estimate"]["peak_mem_mb"]["measured"] == memory["measured"]
    again = estimate(spec, device="cpu")
    assert again.term("runtime").basis == "measured here"
    assert again.peak.value == pytest.approx(memory["measured"], rel=0.02)  # one run: its own residual

    # `ortlab runs` says how far the estimate was off, from the run folder's numbers only
    from rich.console import Console

    from ortlab.runfolder.compare import estimate_errors, render_runs, row_for
    from ortlab.runfolder.rundir import RunDir

    row = row_for(RunDir(result["run_dir"]))
    assert row.estimate == {"peak_mem_mb": memory["error"], "step_time_s": step["error"]}
    console = Console(width=160, record=True)
    render_runs([row], "runs", console=console)
    assert f"mem {memory['error']:+.0%} step {step['error']:+.0%}" in console.export_text()
    forged = {"estimate": {"peak_mem_mb": {"error": "[red]x"}, "step_time_s": {"error": float("nan")}}}
    assert estimate_errors(forged) == {} and estimate_errors({"estimate": ["x"]}) == {}
    # and the model card, beside the measured throughput
    from ortlab.publish.card import model_card

    card = model_card(RunDir(result["run_dir"]))
    line = next(x for x in card.splitlines() if x.startswith("- estimated before the run"))
    assert f"{memory['predicted']:.0f} MB predicted, {memory['measured']:.0f} MB measured" in line, line


# --- budget ---------------------------------------------------------------------------------------------------


def test_a_budget_chooses_what_to_change_and_says_why(tiny_llama, cache):
    from ortlab.estimator.budget import BudgetError, fit_budget

    spec = RunSpec.parse(
        {
            "task": "causal-lm",
            "model": {"name": str(tiny_llama)},
            "data": {"source": "embedded:hamlet"},
            "hyper": {"batch_size": 64, "max_length": 128},
        }
    )
    full = estimate(spec, device="cpu")
    runtime = full.term("runtime").value
    # a memory budget between the smallest run and this one: checkpointing first, then the batch (same effective)
    limit_gb = (runtime + (full.peak.value - runtime) / 3) * 2**20 / 1e9
    fitted = fit_budget(spec, memory_gb=limit_gb, device="cpu")
    assert fitted.estimate.peak.value <= limit_gb * 1e9 / 2**20
    assert fitted.spec.hyper.gradient_checkpointing and fitted.choices[0].startswith("gradient checkpointing")
    hyper = fitted.spec.hyper
    assert hyper.batch_size * hyper.gradient_accumulation_steps == 64  # the same effective batch
    # a time budget: max_steps so that the whole run takes at most the minutes given
    minutes = (full.total.value - full.steps * full.step.value + 5 * full.step.value) / 60
    timed = fit_budget(spec, minutes=minutes, device="cpu")
    assert timed.spec.hyper.max_steps == 5 and timed.estimate.total.value <= minutes * 60 + 1e-6
    assert "max_steps 5" in timed.choices[0]
    with pytest.raises(BudgetError, match="closest budget is"):
        fit_budget(spec, minutes=0.01, device="cpu")
    with pytest.raises(BudgetError, match=r"needs \d+\.\d+ GB"):
        fit_budget(spec, memory_gb=0.1, device="cpu")
    # the spec's own budget section, as the launch and the workbench fit it: never without a line to show
    from ortlab.estimator.budget import fit_spec_budget

    roomy = RunSpec.parse({**spec.model_dump(mode="json"), "hyper": {"max_steps": 2}, "budget": {"memory_gb": 500}})
    assert roomy.budget.asked and not RunSpec.parse({}).budget.asked
    assert fit_spec_budget(roomy).choices[0].startswith("nothing changed: the estimate (")
    on_cluster = RunSpec.parse({**roomy.model_dump(mode="json"), "target": {"cluster": "local"}})
    with pytest.raises(BudgetError, match="the cluster's workers are other machines"):
        fit_spec_budget(on_cluster)


def test_auto_precision_on_a_cpu_is_what_runs_of_the_model_chose_here(tiny_bert, cache):
    """'auto' on a CPU is the precision race's answer for the model: fp32 until a run here measured, then what the
    runs chose; a run that trained in bf16 teaches the efficiency under the bf16 key (against the bf16 peak), while
    its result keeps what was predicted before it."""
    from ortlab.estimator.checked import after_run, ran_precision

    spec = RunSpec.parse({**bert_spec(tiny_bert).model_dump(mode="json"), "accel": {"precision": "auto"}})
    before = estimate(spec, device="cpu")
    assert before.precision == "fp32" and any("until a run here measures" in n for n in before.notes)
    bf16 = estimate(RunSpec.parse({**spec.model_dump(mode="json"), "accel": {"precision": "bf16"}}), device="cpu")
    result = {
        "summary": {"peak_mem_mb": bf16.peak.value, "steady_step_time_s": 2 * bf16.step.value},
        "wall_time_s": 2 * bf16.total.value,
        "accelerations": {"bf16": {"applied": True}, "fp16": {"applied": False}},
        "eval_before": {"eval_runtime": 1.5, "eval_loss": 0.7},  # one evaluation took 1.5 s
    }
    assert ran_precision(result) == "bf16" and ran_precision({"accelerations": {}}) == "fp32"
    out = after_run(before, spec, result)
    assert out["precision"] == {"predicted": "fp32", "ran": "bf16"}
    assert out["step_time_s"]["predicted"] == before.step.value  # what was said before the run, unchanged
    assert out["recorded"] and 0 < out["learned"]["efficiency"] < bf16.efficiency  # half the speed it assumed
    again = estimate(spec, device="cpu")
    assert again.precision == "bf16" and any("as runs of this model here measured" in n for n in again.notes)
    assert again.model["calibration_key"].endswith("/bf16")
    assert again.efficiency == pytest.approx(out["learned"]["efficiency"])  # the run's, not the default
    evaluation = next(t for t in again.total_parts if t.name == "evaluation")
    assert evaluation.value == pytest.approx(2 * 1.5)  # the two evaluations, as long as the measured one
    other = RunSpec.parse({**spec.model_dump(mode="json"), "model": {"name": str(tiny_bert) + "/."}})
    assert estimate(other, device="cpu").precision == "fp32"  # another model (by name): not measured yet


def test_the_budget_clock_ends_training_once_and_only_before_the_last_step():
    from types import SimpleNamespace

    from ortlab.lifecycle.budgetclock import SAVE_BASE_S, SAVE_BYTES_PER_S, BudgetClock, reserve_s

    now, said = [0.0], []
    clock = BudgetClock(10.0, said.append, clock=lambda: now[0])
    control = SimpleNamespace(should_training_stop=False)
    state = SimpleNamespace(global_step=3, max_steps=100)
    clock.on_step_end(None, state, control)
    assert not control.should_training_stop and clock.ended_at_step is None
    now[0], state.global_step = 10.5, 4
    clock.on_step_end(None, state, control)
    assert control.should_training_stop and clock.ended_at_step == 4 and "step 4 of 100" in said[0]
    state.global_step = 5
    clock.on_step_end(None, state, control)
    assert clock.ended_at_step == 4 and len(said) == 1  # once
    late = BudgetClock(0.0, said.append, clock=lambda: 99.0)
    control = SimpleNamespace(should_training_stop=False)
    late.on_step_end(None, SimpleNamespace(global_step=100, max_steps=100), control)
    assert late.ended_at_step is None  # the last step ends the run anyway: not "ended early"
    assert reserve_s(4.0, 2, 6e8) == pytest.approx(1.1 * 4.0 + SAVE_BASE_S + 6e8 / SAVE_BYTES_PER_S)
    assert reserve_s(None, 2) == 12.0


def test_a_budget_is_fitted_at_launch_and_the_run_ends_in_time(tiny_bert, tmp_path, cache, monkeypatch):
    """`budget.minutes` through launch: the fitted spec (max_steps, and what changed in budget.fitted) is the run
    folder's; a budget that holds no step is refused before any folder exists; and should the run go slower than
    predicted, it ends training in time and still completes (here the reserve for the final evaluation is made to
    cover the whole budget, so the clock ends training at its first step)."""
    from ortlab.estimator.budget import fit_budget
    from ortlab.lifecycle import budgetclock
    from ortlab.runner import RunError, train_spec

    base = {**bert_spec(tiny_bert).model_dump(mode="json"), "output_dir": str(tmp_path / "runs")}
    base["hyper"] = {**base["hyper"], "max_steps": None, "epochs": 50.0}  # 400 steps asked
    with pytest.raises(RunError, match="closest budget is"):
        train_spec(RunSpec.parse({**base, "budget": {"minutes": 0.001}}), progress=False, log=lambda line: None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    est = estimate(RunSpec.parse(base), device="cpu")
    # six and a half steps' worth: the fit rounds down, and exactly six could come out as 5.999...
    minutes = (est.total.value - est.steps * est.step.value + 6.5 * est.step.value) / 60
    assert fit_budget(RunSpec.parse(base), minutes=minutes, device="cpu").spec.hyper.max_steps == 6
    monkeypatch.setattr(budgetclock, "reserve_s", lambda eval_s, minutes, save_bytes: minutes * 60)
    said: list[str] = []
    result = train_spec(RunSpec.parse({**base, "budget": {"minutes": minutes}}), progress=False, log=said.append)
    stored = RunSpec.from_run(result["run_dir"])
    assert stored.hyper.max_steps == 6 and stored.budget.fitted[0].startswith("max_steps 6:"), stored.budget
    assert f"fitted to the budget: {stored.budget.fitted[0]}" in said
    assert result["budget"]["ended_early_at_step"] == 1 and result["summary"]["steps"] == 1
    assert result["eval_after"] and (Path(result["run_dir"]) / "model").is_dir()  # evaluated and saved all the same
    assert any("the budget's time is up at step 1 of 6" in line for line in said)


def test_the_benchmark_never_calibrates_a_row_with_its_own_measurement(load_benchmark, tmp_path, cache, monkeypatch):
    """bench_estimate's leave-one-out, from kept measurements (nothing trains): a row's `loo` prediction moves with
    the other rows' measurements and never with its own."""
    bench = load_benchmark("bench_estimate")
    monkeypatch.setenv("ORTLAB_ESTIMATE_RECORD", "0")  # (main sets it: monkeypatch puts the old value back)
    names = ["minilm-b8-l32", "minilm-b32-l128"]

    def analyse(first_peak: float) -> dict:
        rows = {
            name: {
                "spec": bench.GRID[name],
                "summary": {"peak_mem_mb": peak, "steady_step_time_s": step},
                "cpu_step_s": step / 2,
                "seconds": 1.0,
            }
            for name, peak, step in ((names[0], first_peak, 2.0), (names[1], 1700.0, 8.0))
        }
        kept, out = tmp_path / "rows.json", tmp_path / "out.json"
        kept.write_text(json.dumps(rows))
        argv = ["bench_estimate.py", "--reuse", "--measured", str(kept), "--out", str(out), "--only", *names]
        monkeypatch.setattr(sys, "argv", argv)
        bench.main()
        return json.loads(out.read_text())

    one, two = analyse(1100.0), analyse(1300.0)
    first, second = names
    own = [r["rows"][first]["loo"]["wall"]["peak_mem_mb"]["predicted"] for r in (one, two)]
    other = [r["rows"][second]["loo"]["wall"]["peak_mem_mb"]["predicted"] for r in (one, two)]
    assert own[0] == own[1] and other[0] != other[1]
    assert one["summary"]["wall"]["default"]["peak_mem_mb"]["rows"] == 2
    assert set(one["summary"]) == {"wall", "cpu"}
