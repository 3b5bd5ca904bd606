"""Issue #48, Low items: a spec's booleans are true or false (no lax 'yes', 'on', 1), and the target fields that only
mean something on a Ray cluster are refused without one, each with a message that says what to write."""

from __future__ import annotations

import json

import pytest

from ortlab.spec import RunSpec, SpecError, TargetSpec


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("data:\n  lazy: yes\n", "data.lazy"),
        ("data:\n  shuffle: 'no'\n", "data.shuffle"),
        ("accel:\n  ort: on\n", "accel.ort"),
        ("accel:\n  tf32: 'true'\n", "accel.tf32"),
        ("hyper:\n  gradient_checkpointing: 1\n", "hyper.gradient_checkpointing"),
        ("adapter:\n  kind: lora\n  save_merged: Off\n", "adapter.save_merged"),
    ],
)
def test_a_boolean_that_is_not_true_or_false_is_refused_in_yaml(text, field):
    with pytest.raises(SpecError) as e:
        RunSpec.from_yaml(text)
    assert f"{field}: write true" in str(e.value), str(e.value)
    assert "are not read" in str(e.value)


def test_a_boolean_that_is_not_true_or_false_is_refused_in_json():
    for value in ('"false"', "0", '"on"', "null"):
        with pytest.raises(SpecError, match=r"data.lazy: write true or false \(got "):
            RunSpec.parse(json.loads(f'{{"data": {{"lazy": {value}}}}}'))
    with pytest.raises(SpecError, match=r"accel.fused_adam: write true, false or 'auto' \(got 'yes'"):
        RunSpec.parse({"accel": {"fused_adam": "yes"}})


def test_real_booleans_and_auto_still_read_everywhere():
    """What the CLI's flags, the sidebar's form (JSON true/false from the toggles) and the workbench's checkboxes
    send: unchanged."""
    spec = RunSpec.from_yaml("data:\n  shuffle: false\naccel:\n  ort: False\n  fused_adam: auto\n  tf32: TRUE\n")
    assert (spec.data.shuffle, spec.accel.ort, spec.accel.fused_adam, spec.accel.tf32) == (False, False, "auto", True)
    spec = RunSpec.parse({"accel": {"ort": True, "zero_stage": 0}, "hyper": {"gradient_checkpointing": False}})
    assert spec.accel.ort is True
    assert RunSpec.from_yaml(spec.to_yaml()) == spec, "what ortlab writes reads back"
    with pytest.raises(ValueError, match="write true or false"):
        spec.data.shuffle = "yes"  # (assignment is validated too: the workbench sets fields one by one)
    # YAML 1.1's yes/no are words now: a string field keeps them (PyYAML made `name: no` False).
    assert RunSpec.from_yaml("name: no\n").name == "no"


@pytest.mark.parametrize(
    "target",
    [{"start_timeout_s": 30}, {"cpus_per_process": 4}, {"max_failures": 2}, {"gpus_per_process": 1}],
)
def test_a_cluster_only_field_without_a_cluster_is_refused(target):
    name = next(iter(target))
    with pytest.raises(SpecError) as e:
        RunSpec.parse({"target": target})
    assert f"target: {name}: only for a cluster run" in str(e.value) and "set target.cluster" in str(e.value)
    assert RunSpec.parse({"target": {**target, "cluster": "local"}}).target.cluster == "local"


def test_the_cluster_only_fields_at_their_defaults_are_fine_without_a_cluster():
    """A spec written out whole (`ortlab spec`, the CLI's base) names every field at its default."""
    whole = RunSpec().model_dump(mode="json")
    assert whole["target"]["start_timeout_s"] == TargetSpec.model_fields["start_timeout_s"].default
    assert RunSpec.parse(whole).target.cluster is None
