"""RunSpec: defaults, round trips, schema, and errors that name the field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

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
        ({"accel": {"ort": True, "torch_compile": True}}, "accel", "ort and torch_compile both take over"),
        ({"accel": {"ort": True, "zero_stage": 3}}, "accel", "ort cannot run with ZeRO stage 3"),
        ({"task": "causal-lm", "data": {"label_column": "label"}}, "spec", "remove label_column"),
    ],
)
def test_errors_name_the_field_and_the_fix(data, field, text):
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

    monkeypatch.setattr(ort, "availability", lambda probe=False: Availability("ort", True, "forced", "-"))
    monkeypatch.setattr(
        fused_adam, "availability", lambda probe=False: Availability("fused_adam", fused_here, "forced", "-")
    )
    monkeypatch.setattr(mix, "_cuda_available", lambda: cuda)
    auto = mix.resolve(AccelSpec())
    assert (auto.ort, auto.fused_adam, auto.precision) == (False, fused_here, "fp32")
    explicit = mix.resolve(AccelSpec(ort=True, fused_adam=False, precision="bf16"))
    assert (explicit.ort, explicit.fused_adam, explicit.precision) == (True, False, "bf16")


def test_a_spec_validates_only_itself_and_never_imports_torch():
    """A spec is a description: one asking for what this machine lacks (fp16 without CUDA, a tracker that is not
    installed) parses, on any machine, without torch; the machine is judged when a run is launched (below)."""
    code = (
        "import json, sys; from ortlab.spec import RunSpec; "
        "s = RunSpec.parse({'accel': {'precision': 'fp16', 'tf32': True}, 'report_to': ['wandb']}); "
        "print(json.dumps({'precision': s.accel.precision, 'torch': 'torch' in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"precision": "fp16", "torch": False}


def test_the_launch_judges_the_machine_before_any_folder_exists(tmp_path):
    import torch

    from ortlab.runner import RunError, launch

    if torch.cuda.is_available():
        pytest.skip("fp16 runs on this machine")
    with pytest.raises(RunError, match=r"fp16 is not available in this Python: fp16 needs a CUDA device.*Fix: "):
        launch({"accel": {"precision": "fp16"}, "output_dir": str(tmp_path / "runs")})
    assert not (tmp_path / "runs").exists(), "a refused launch leaves nothing behind"


def test_a_spec_file_is_read_bounded_and_only_if_it_is_a_file(tmp_path):
    """A spec path from the command line or `launch(path)`: a FIFO (which would block for ever) or a file far larger
    than a spec is refused with the reason, never read whole; a link the user made to a real spec is followed."""
    from ortlab.runfolder.rundir import SPEC_MAX_BYTES

    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="is not a regular file"):
        RunSpec.load(fifo)
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: x\n" + "#" * (SPEC_MAX_BYTES + 1))
    with pytest.raises(SpecError, match="larger than"):
        RunSpec.load(huge)
    with pytest.raises(SpecError, match="does not exist"):
        RunSpec.load(tmp_path / "missing.yaml")
    real = tmp_path / "real.yaml"
    real.write_text("name: linked\n")
    (tmp_path / "link.yaml").symlink_to(real)
    assert RunSpec.load(tmp_path / "link.yaml").name == "linked"


@pytest.mark.parametrize(
    ("storage", "stored"),
    [
        ("s3://bucket/runs", "s3://bucket/runs"),
        ("s3://bucket/runs/", "s3://bucket/runs"),
        ("s3://bucket", "s3://bucket"),
        ("gs://bucket/team/runs", "gs://bucket/team/runs"),
        ("/shared/runs", "/shared/runs"),
        ("file:///shared/runs", "/shared/runs"),  # taken literally it was a folder named 'file:' here
        ("file://localhost/shared/runs", "/shared/runs"),
    ],
)
def test_storage_spellings_a_user_writes_are_accepted(storage, stored):
    assert RunSpec.parse({"target": {"cluster": "local", "storage": storage}}).target.storage == stored


@pytest.mark.parametrize(
    ("storage", "why"),
    [
        ("s3://allowed/runs/../../other/x", "'..' segment"),
        ("s3://allowed/runs/./x", "'.' or '..' segment"),
        ("s3://allowed//x", "an empty"),
        ("s3://KEY:hunter2@bucket/runs", "carries credentials"),
        ("s3://bucket/runs?secret_key=hunter2", "carries a credential in its query"),
        ("ftp://host/runs", "is not a storage ortlab knows"),
        ("file://server/runs", "must name a folder on this machine"),
        ("file:///shared/runs?x=1", "takes no ?query"),
    ],
)
def test_storage_spellings_that_do_not_say_plainly_where_they_go_are_refused(storage, why):
    with pytest.raises(ValueError, match=re.escape(why)) as caught:
        RunSpec.parse({"target": {"cluster": "local", "storage": storage}})
    assert "hunter2" not in str(caught.value), "a credential is never echoed"
