"""A preference run exports as a causal-lm run does (issue #44: "what export supports it"): a tiny DPO run of the
tiny chat Llama, with LoRA (the merged model exported) and in full, to ONNX with its KV cache and the parity check
on rows made from its held-out pairs, and to GGUF; the rows are the prompt with the chosen answer, token for token
as training encoded that side. A task that truly cannot write GGUF is still refused, naming the tasks that can."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec

pytestmark = pytest.mark.slow  # two tiny DPO runs (a few seconds each) and their exports of a 2-layer model


def dpo_spec(model: Path, root: Path, name: str, lora: bool) -> dict:
    spec = {
        "name": name,
        "task": "preference",
        "model": {"name": str(model)},
        "output_dir": str(root),
        "data": {"source": "embedded:rotten-tomatoes-pairs", "max_train_samples": 16, "max_eval_samples": 8},
        "hyper": {"max_steps": 2, "batch_size": 4, "max_length": 160, "learning_rate": 1e-2, "logging_steps": 1},
        "preference": {"loss": "dpo", "beta": 0.1},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32", "tune": "off"},
    }
    if lora:
        spec["adapter"] = {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0}
    return spec


@pytest.fixture(scope="module")
def dpo_runs(tiny_chat_llama, tmp_path_factory) -> dict[str, Path]:
    """A completed DPO run with LoRA and one in full (2 steps each): their folders."""
    from ortlab.runner import train_spec

    root = tmp_path_factory.mktemp("dpo-export")
    runs = {}
    for kind in ("lora", "full"):
        spec = RunSpec.parse(dpo_spec(tiny_chat_llama, root, f"dpo-{kind}", kind == "lora"))
        runs[kind] = Path(train_spec(spec, progress=False, log=lambda _: None)["run_dir"])
    assert (runs["lora"] / "model" / "adapter_config.json").is_file()
    assert (runs["full"] / "model" / "config.json").is_file()
    return runs


def test_the_export_rows_are_the_prompt_with_the_chosen_answer_as_trained(dpo_runs):
    """The parity check's inputs: each held-out pair's chosen side, the ids training fed the model for it."""
    from ortlab.data import load_and_check
    from ortlab.data.pairtokens import tokenize_prepared
    from ortlab.export.graphs import _eval_batch
    from ortlab.tasks import load_tokenizer

    run = RunDir(dpo_runs["lora"])
    spec = RunSpec.from_run(run)
    tokenizer = load_tokenizer(str(run.model_dir))
    inputs, labels = _eval_batch(run, tokenizer, 8)
    _, trained = tokenize_prepared(load_and_check(spec.data, spec.task, spec.seed), tokenizer, spec.task, 160)
    assert labels is None and len(inputs["input_ids"]) == len(trained) == 8
    for ids, mask, row in zip(inputs["input_ids"], inputs["attention_mask"], trained, strict=True):
        assert ids[mask.bool()].tolist() == row["chosen_input_ids"]
        assert row["chosen_input_ids"] != row["rejected_input_ids"]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_dpo_run_exports_to_onnx_with_parity(dpo_runs, kind):
    from ortlab.export import MAX_ABS_DIFF, export_onnx

    report = export_onnx(dpo_runs[kind], samples=8)
    assert report.good and report.task == "preference" and report.samples == 8
    fp32 = report.variants["fp32"]
    assert fp32.max_abs_diff < MAX_ABS_DIFF and fp32.agreement == 1.0
    assert fp32.generation_agreement == 1.0  # the cache graph's greedy tokens are PyTorch's
    assert report.generation["kv_cache"] is True
    assert json.loads((dpo_runs[kind] / "onnx" / "export.json").read_text())["good"] is True


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_dpo_run_exports_its_trained_model_to_gguf(dpo_runs, tiny_chat_llama, kind):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ortlab.export import export_gguf

    report = export_gguf(dpo_runs[kind], quant="f16", prompts=4, max_new_tokens=8)
    assert report.good, report.to_dict()
    assert "preference rows" in report.prompts_from and "generation prompt" in report.prompts_from
    f16 = report.variants["f16"]
    assert f16.prompts == f16.tokenizer_identical == 4 and f16.chat_template_identical
    assert f16.max_abs_logit_diff <= f16.tolerance
    assert (dpo_runs[kind] / "gguf" / "Modelfile").is_file()
    # the file is the trained model (a LoRA run's adapter merged), not the base it started from
    folder = dpo_runs[kind] / "gguf"
    back = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=f16.file, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_chat_llama), dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(str(tiny_chat_llama))("Is this review fresh or rotten?", return_tensors="pt")
    with torch.no_grad():
        moved = float((back(ids.input_ids).logits - base(ids.input_ids).logits).abs().max())
    assert moved > 10 * f16.max_abs_logit_diff


def test_a_task_that_cannot_write_gguf_is_refused_naming_those_that_can(tiny_chat_llama, tmp_path):
    from ortlab.export import ExportError, export_gguf

    spec = RunSpec.parse(
        {"name": "cls", "task": "sequence-classification", "model": {"name": str(tiny_chat_llama)},
         "data": {"source": "embedded:rotten-tomatoes"}}
    )  # fmt: skip
    run = RunDir.create(tmp_path, spec)
    shutil.copytree(tiny_chat_llama, run.model_dir, dirs_exist_ok=True)
    run.set_status("completed")
    with pytest.raises(ExportError, match=r"tasks that export to GGUF: causal-lm, preference\), not a sequence-class"):
        export_gguf(run.path)


def test_kto_rows_put_the_desirable_answers_first(tiny_chat_llama):
    """KTO's rows have no chosen side: the desirable answers come first, each with its prompt rendered to continue."""
    from ortlab.data import load_and_check
    from ortlab.data.pairs import normalize_row
    from ortlab.data.pairtokens import lm_rows
    from ortlab.spec import DataSpec
    from ortlab.tasks import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_chat_llama))
    prepared = load_and_check(DataSpec(source="embedded:rotten-tomatoes-kto", max_eval_samples=8), "preference", 0)
    labels = [normalize_row(r, prepared.pairs)["label"] for r in prepared.eval]
    assert 0 < sum(labels) < len(labels)
    rows = lm_rows(prepared, tokenizer, 160, len(labels))
    assert len(rows) == len(labels)
    desirable = sum(labels)
    good = [normalize_row(r, prepared.pairs) for r in prepared.eval if normalize_row(r, prepared.pairs)["label"]]
    for row, source in zip(rows[:desirable], good, strict=True):
        assert row["prompt"].endswith("<|im_start|>assistant\n")
        assert tokenizer.decode(row["input_ids"]).startswith(row["prompt"])
        assert source["completion"][0]["content"] in tokenizer.decode(row["input_ids"])
