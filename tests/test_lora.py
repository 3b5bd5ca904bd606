"""LoRA adapters (ortlab.adapters): a tiny Llama-architecture model trains with LoRA for real, in PyTorch and under
ORTModule; what the run folder keeps reloads to the same model; resume, merge and export work on adapter runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two tiny training runs (PyTorch, ORTModule) shared by the module: ~20 s
STEPS = 6


def _spec(model: Path, root: Path, name: str, **accel):
    from ortlab.spec import RunSpec

    return RunSpec.parse(
        {
            "name": name,
            "task": "causal-lm",
            "model": {"name": str(model)},
            "output_dir": str(root),
            "data": {"source": "embedded:hamlet", "max_train_samples": 160, "max_eval_samples": 100},
            "hyper": {
                "learning_rate": 1e-2,
                "batch_size": 8,
                "eval_batch_size": 64,
                "max_length": 32,
                "max_steps": STEPS,
                "logging_steps": 1,
                "save_steps": 3,
            },
            # Explicit, so that 'auto' cannot make the two runs differ in anything but ORT.
            "accel": {"ort": False, "fused_adam": False, "precision": "fp32", "tune": "off", **accel},
            # No dropout: ORT draws its dropout masks from its own generator, and the losses are compared.
            "adapter": {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0, "save_merged": True},
        }
    )


def _train(spec) -> dict:
    from ortlab.runner import train_spec

    return train_spec(spec, progress=False, log=lambda _: None)


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("event") == "step"}


@pytest.fixture(scope="module")
def runs(tiny_llama, tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("lora-runs")
    eager = _train(_spec(tiny_llama, root, "eager"))
    ort = _train(_spec(tiny_llama, root, "ort", ort=True, ort_fallback="error"))
    return {"eager": eager, "ort": ort}


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_lora_trains_only_the_adapter(runs, tiny_llama):
    result = runs["eager"]
    run = Path(result["run_dir"])
    assert result["eval_after"]["eval_loss"] < result["eval_before"]["eval_loss"]
    losses = _losses(run)
    assert len(losses) == STEPS and losses[STEPS] < losses[1]
    # The run folder keeps the adapter alone: LoRA's matrices, not a copy of the base model.
    model_dir = run / "model"
    adapter = _tensors(model_dir / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter), sorted(adapter)[:5]
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in adapter.items())  # B starts at zero
    assert json.loads((model_dir / "adapter_config.json").read_text())["r"] == 4
    assert (model_dir / "tokenizer.json").is_file()
    assert not (model_dir / "model.safetensors").exists()
    # The merged model differs from the base exactly in the adapted projections: every other weight is frozen.
    base = _tensors(tiny_llama / "model.safetensors")
    merged = _tensors(model_dir / "merged" / "model.safetensors")
    assert set(merged) == set(base)
    changed = {k for k in base if not (base[k] == merged[k]).all()}
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    assert changed and all(k.split(".")[-2] in targets for k in changed), sorted(changed)
    assert {k.split(".")[-2] for k in changed} == set(targets)
    # What trained, in numbers: in result.json and in the metrics stream.
    params = result["parameters"]
    assert 0 < params["trainable"] < params["total"] / 10
    assert params["optimizer_state_bytes"] >= 2 * 4 * params["trainable"]  # AdamW: two fp32 moments
    assert params["optimizer_state_bytes"] < 4 * 4 * params["trainable"]
    saved = json.loads((run / "result.json").read_text())
    assert saved["parameters"] == params
    assert saved["adapter"]["target_modules"] == sorted(targets)
    assert saved["adapter"]["base_model"] == str(tiny_llama)


def test_the_saved_adapter_reloads_to_the_trained_model(runs):
    """PeftModel.from_pretrained on the base gives the model that ended training: the merged model's logits (merged
    from the trained model in memory) and the final evaluation's loss."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ortlab.data import tokenize
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec
    from ortlab.tasks import load_tokenizer

    result = runs["eager"]
    run = Path(result["run_dir"])
    spec = RunSpec.load(run / "spec.yaml")
    base = AutoModelForCausalLM.from_pretrained(spec.model.name)
    reloaded = PeftModel.from_pretrained(base, str(run / "model")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(run / "model" / "merged")).eval()
    model_path, prepared = check_model_and_data(spec, log=lambda _: None)
    _, eval_ds = tokenize(prepared, load_tokenizer(model_path), spec.task, spec.hyper.max_length)
    ids = torch.tensor(eval_ds["input_ids"])
    with torch.no_grad():
        out = reloaded(input_ids=ids, labels=ids)
        assert torch.allclose(out.logits, merged(input_ids=ids).logits, atol=1e-4)
    assert len(ids) <= spec.hyper.eval_batch_size  # one batch: the trainer's eval loss is this mean
    assert out.loss.item() == pytest.approx(result["eval_after"]["eval_loss"], abs=1e-4)


def test_lora_under_ortmodule_trains_what_pytorch_trains(runs):
    result = runs["ort"]
    ort = result["accelerations"]["ort"]
    assert ort["applied"], ort
    assert ort["details"]["options"]["fallback"] == "error"
    eager, under_ort = _losses(Path(runs["eager"]["run_dir"])), _losses(Path(result["run_dir"]))
    assert set(eager) == set(under_ort)
    for step in eager:
        assert under_ort[step] == pytest.approx(eager[step], abs=2e-3), step
    assert result["parameters"]["trainable"] == runs["eager"]["parameters"]["trainable"]


def test_an_adapter_run_resumes_from_its_checkpoint(runs, tmp_path):
    """A copy of the finished run, cut back to its step-3 checkpoint, resumes and ends where the run ended."""
    from fake_runs import cut_back

    from ortlab.lifecycle.execute import execute

    source = Path(runs["eager"]["run_dir"])
    run_path = tmp_path / source.name
    run = cut_back(source, run_path, step=3, last_checkpoint=STEPS)  # as `resume` claims it
    spec_text = (run_path / "spec.yaml").read_text().replace(str(source.parent), str(tmp_path))
    (run_path / "spec.yaml").write_text(spec_text)
    result = execute(run, resume=True, progress=False, log=lambda _: None)
    assert result["summary"]["steps"] == STEPS
    original, resumed = _losses(source), _losses(run_path)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(original[step], abs=1e-5), step
    a = _tensors(source / "model" / "adapter_model.safetensors")
    b = _tensors(run_path / "model" / "adapter_model.safetensors")
    assert set(a) == set(b)
    assert all((a[k] - b[k]).abs().max() < 1e-5 for k in a)


def test_target_modules_are_checked_before_the_model_loads(tiny_llama, tmp_path):
    from ortlab.adapters import AdapterError
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec, SpecError

    spec = _spec(tiny_llama, tmp_path, "bad").model_dump(mode="json")
    spec["adapter"]["target_modules"] = ["q_proj", "query"]
    with pytest.raises(AdapterError, match=r"'query' is not a Linear layer.*k_proj.*v_proj"):
        check_model_and_data(RunSpec.parse(spec), log=lambda _: None)
    spec["adapter"]["target_modules"] = ["q_proj; rm -rf /"]
    with pytest.raises(SpecError, match=r"adapter\.target_modules: .* is not a layer name"):
        RunSpec.parse(spec)
    assert not list(tmp_path.iterdir())  # nothing that looks like a run was created


def test_a_target_error_lists_the_linear_layers_in_a_fresh_process(tiny_bert):
    # In a fresh process the model's module is first imported while the skeleton is built on the meta device, which
    # failed inside torch._dynamo's import and surfaced as "ModuleNotFoundError: BertForSequenceClassification"
    # (a process that has imported it already, as this one, never saw it).
    import subprocess

    from conftest import PYTHON

    code = (
        "from ortlab.adapters import AdapterError, check_model\n"
        "for targets in (['no_such_layer'], ['classifier']):\n"
        "    try:\n"
        f"        check_model({str(tiny_bert)!r}, 'sequence-classification', targets)\n"
        "    except AdapterError as e:\n"
        "        print('REFUSED', e)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2, out.stderr[-3000:]
    assert "'no_such_layer' is not a Linear layer" in refused[0] and "dense, key, query, value" in refused[0]
    # The head alone: peft trains it in full anyway, so an adapter there adapts nothing (peft's own error came
    # after the model had loaded, without the layers).
    assert "'classifier' is the task head" in refused[1] and "dense, key, query, value" in refused[1]


def test_merging_the_saved_adapter_gives_the_saved_merged_model(runs):
    import torch
    from transformers import AutoModelForCausalLM

    from ortlab.adapters import load_merged

    model_dir = Path(runs["eager"]["run_dir"]) / "model"
    merged_here = load_merged(str(model_dir), "causal-lm").eval()
    saved = AutoModelForCausalLM.from_pretrained(str(model_dir / "merged")).eval()
    ids = torch.arange(2, 34).reshape(2, 16)
    with torch.no_grad():
        assert torch.allclose(merged_here(input_ids=ids).logits, saved(input_ids=ids).logits, atol=1e-5)


def test_export_and_publish_an_adapter_run(runs, tmp_path):
    """export: the merged model to ONNX, with the parity check; push: the adapter (default) or the merged model,
    the card saying which and naming the base model."""
    from ortlab.export import export_onnx
    from ortlab.publish import PublishError, push_to_folder

    run = Path(runs["ort"]["run_dir"])
    report = export_onnx(run, samples=16, batch_sizes=(1,))
    assert report.good, report.to_dict()
    assert report.variants["fp32"].agreement == 1.0
    adapter = push_to_folder(run, tmp_path / "adapter")
    names = {p.name for p in adapter.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "README.md"} <= names
    assert "model.safetensors" not in names
    card = (adapter / "README.md").read_text()
    assert "library_name: peft" in card and "**LoRA adapter (rank 4" in card and "needs the base model" in card
    assert "trainable parameters:" in card
    merged = push_to_folder(run, tmp_path / "merged", merged=True)
    names = {p.name for p in merged.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names and "adapter_config.json" not in names
    card = (merged / "README.md").read_text()
    assert "library_name: transformers" in card and "**merged model**" in card
    full = tmp_path / "full"
    shutil.copytree(run, full)
    shutil.rmtree(full / "model")
    (full / "model").mkdir()
    (full / "model" / "config.json").write_text("{}")
    with pytest.raises(PublishError, match="no adapter to merge"):
        push_to_folder(full, tmp_path / "nothing", merged=True)


def test_every_task_gets_an_adapter_and_new_heads_stay_trainable(tiny_bert, tiny_gpt2):
    """Which layers are adapted, found from the architecture; a classification head trains in full."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from ortlab.adapters import AdapterError, apply_lora, find_target_modules, parameter_counts
    from ortlab.spec import AdapterSpec
    from ortlab.tasks import load_model

    lora = AdapterSpec(kind="lora", rank=2)
    for auto, task in (
        (AutoModelForSequenceClassification, "sequence-classification"),
        (AutoModelForTokenClassification, "token-classification"),
    ):
        model = apply_lora(auto.from_pretrained(tiny_bert, num_labels=3), lora, task)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert any("classifier" in n for n in trainable), task
        assert {n.split(".")[-4] for n in trainable if "lora_" in n} == {"query", "value"}  # peft's BERT default
        assert not any("embeddings" in n or "dense" in n for n in trainable)
    gpt2 = apply_lora(load_model(str(tiny_gpt2), "causal-lm", []), lora, "causal-lm")
    assert 0 < parameter_counts(gpt2)["trainable"] < parameter_counts(gpt2)["total"] / 10
    ids = torch.tensor([[5, 6, 7, 8]])
    gpt2(input_ids=ids, labels=ids).loss.backward()  # GPT-2's Conv1D is adapted as a Linear (fan_in_fan_out)

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = torch.nn.Linear(4, 4)
            self.readout = torch.nn.Linear(4, 2)

    with pytest.raises(AdapterError, match=r"name them in adapter\.target_modules .*mixer, readout"):
        find_target_modules(Odd())


def test_gradient_checkpointing_trains_the_same_adapter(runs, tiny_llama, tmp_path):
    """hyper.gradient_checkpointing recomputes each layer in the backward pass (torch's non-reentrant checkpoint,
    which reaches the adapter behind frozen embeddings): the model says it checkpoints, and the losses are the ones
    the same run trains without it."""
    spec = _spec(tiny_llama, tmp_path, "checkpointed")
    spec = spec.model_copy(update={"hyper": spec.hyper.model_copy(update={"gradient_checkpointing": True})})
    result = _train(spec)

    def begin(run: Path) -> dict:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in records if r.get("event") == "train_begin")

    assert begin(Path(result["run_dir"]))["device"]["gradient_checkpointing"] is True
    assert begin(Path(runs["eager"]["run_dir"]))["device"]["gradient_checkpointing"] is False
    with_it, without = _losses(Path(result["run_dir"])), _losses(Path(runs["eager"]["run_dir"]))
    assert list(with_it) == list(without) == list(range(1, STEPS + 1))
    assert with_it == pytest.approx(without, rel=1e-5, abs=1e-6), "recomputing changes the memory, not the math"


def test_gradient_checkpointing_with_ort_is_refused_when_written():
    from ortlab.spec import RunSpec, SpecError

    with pytest.raises(SpecError, match="gradient_checkpointing: not with ORT"):
        RunSpec.parse({"accel": {"ort": True}, "hyper": {"gradient_checkpointing": True}})
    assert RunSpec.parse({"hyper": {"gradient_checkpointing": True}}).accel.ort == "auto", "'auto' ORT yields"
