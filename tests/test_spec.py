"""RunSpec: defaults, round trips, schema, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from ortlab.assets import EMBEDDED_MODEL_ID
from ortlab.spec import AccelSpec, RunSpec, SpecError


def test_default_is_the_embedded_job():
    spec = RunSpec()
    assert spec.model.name == EMBEDDED_MODEL_ID
    assert spec.data.source == "embedded:rotten-tomatoes"
    assert spec.task == "sequence-classification"
    assert spec.data.max_train_samples == 2000


def test_round_trips(tmp_path):
    spec = RunSpec.parse(
        {
            "task": "token-classification",
            "data": {"source": "embedded:synthetic-ner", "max_train_samples": 10},
            "hyper": {"learning_rate": 1e-3, "batch_size": 4},
            "accel": {"ort": True, "zero_stage": 1},
            "seed": 7,
        }
    )
    assert RunSpec.from_json(spec.to_json()) == spec
    assert RunSpec.from_yaml(spec.to_yaml()) == spec
    (tmp_path / "s.yaml").write_text(spec.to_yaml())
    (tmp_path / "s.json").write_text(spec.to_json())
    assert RunSpec.load(tmp_path / "s.yaml") == RunSpec.load(tmp_path / "s.json") == spec


def test_json_schema_describes_every_section():
    schema = RunSpec.json_schema()
    assert {"model", "data", "task", "hyper", "accel", "target", "output_dir", "seed"} <= set(schema["properties"])
    json.dumps(schema)  # serialisable
    hyper = schema["$defs"]["HyperSpec"]["properties"]
    assert hyper["learning_rate"]["exclusiveMinimum"] == 0
    assert hyper["learning_rate"]["description"]


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        ({"hyper": {"learning_rate": 0}}, "hyper.learning_rate", "greater than 0"),
        ({"hyper": {"learning_rate": -1e-5}}, "hyper.learning_rate", "greater than 0"),
        ({"hyper": {"batch_size": 0}}, "hyper.batch_size", "greater than 0"),
        ({"task": "summarization"}, "task", "sequence-classification"),
        ({"hyper": {"learnig_rate": 1e-4}}, "hyper.learnig_rate", "unknown field"),
        ({"accel": {"precision": "fp16"}}, "spec", "fp16 needs a CUDA device"),
        ({"task": "causal-lm", "data": {"label_column": "label"}}, "spec", "remove label_column"),
    ],
)
def test_errors_name_the_field_and_the_fix(data, field, text):
    import torch

    if torch.cuda.is_available() and data.get("accel"):
        pytest.skip("fp16 is valid on this machine")
    with pytest.raises(SpecError) as info:
        RunSpec.parse(data)
    message = str(info.value)
    assert f"{field}:" in message
    assert text in message


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.parametrize("fused_here", [True, False])
def test_auto_without_a_measurement_is_what_never_loses(monkeypatch, cuda, fused_here):
    # 'auto' is "measured faster here" (ortlab.tune); with nothing measured it is PyTorch with fused AdamW where the
    # doctor has it, whatever else is installed (ORT too). Explicit choices are never changed.
    from ortlab.accel import Availability, fused_adam, mix, ort

    monkeypatch.setattr(ort, "check", lambda probe=False: Availability("ort", True, "forced", "-"))
    monkeypatch.setattr(fused_adam, "check", lambda probe=False: Availability("fused_adam", fused_here, "forced", "-"))
    monkeypatch.setattr(mix, "_cuda_available", lambda: cuda)
    auto = AccelSpec().resolved()
    assert (auto.ort, auto.fused_adam, auto.precision) == (False, fused_here, "fp32")
    explicit = AccelSpec(ort=True, fused_adam=False, precision="bf16").resolved()
    assert (explicit.ort, explicit.fused_adam, explicit.precision) == (True, False, "bf16")
