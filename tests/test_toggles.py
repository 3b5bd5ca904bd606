"""The acceleration vocabulary is one definition (`ortlab.toggles`): every toggle sets a real spec field to values
the spec accepts, what a form writes is what `Mix.requested` reads back, the doctor reports by the same names,
and the server sends the sidebar this very list."""

from __future__ import annotations

import dataclasses

from ortlab.accel import ACCELERATIONS
from ortlab.mixrules import Mix
from ortlab.spec import AccelSpec, RunSpec
from ortlab.specfields import SpecFields, form
from ortlab.toggles import NAMES, TOGGLES, exclusive_with, field_values, form_toggles, toggle


def test_every_toggle_sets_a_spec_field_to_values_the_spec_accepts():
    fields = SpecFields()
    mix_fields = {f.name for f in dataclasses.fields(Mix)}
    assert len(set(NAMES)) == len(NAMES)
    for t in TOGGLES:
        assert t.field in AccelSpec.model_fields and t.field in mix_fields, t
        assert fields.field(t.path).description, f"{t.path} has no description for the forms' tooltips"
        for value in (t.on, t.off, *t.also_on):
            spec = RunSpec.parse({"accel": {t.field: value}})
            assert getattr(spec.accel, t.field) == value and RunSpec.from_json(spec.to_json()) == spec


def test_what_a_form_writes_is_what_the_run_records_as_requested():
    """Each form toggle alone, and none: the spec the toggles write asks for exactly that acceleration."""
    for ticked in [set(), *({t.name} for t in form_toggles())]:
        spec = RunSpec.parse({"accel": {"tf32": False, "precision": "fp32"}})
        data = spec.model_dump(mode="json")
        for path, value in field_values(ticked).items():
            section, name = path.split(".")
            data[section][name] = value
        requested = RunSpec.parse(data).asked_mix().requested()
        assert list(requested) == list(NAMES)
        assert {n for n, on in requested.items() if on} == ticked, (ticked, requested)
    # ZeRO at any stage is "zero1" (its DeepSpeed check is the doctor's zero1 row)
    assert Mix(zero_stage=3).requested()["zero1"] and not Mix(zero_stage=0).requested()["zero1"]


def test_toggles_of_one_field_exclude_each_other():
    assert exclusive_with("bf16") == ("fp16",) and exclusive_with("fp16") == ("bf16",)
    assert all(exclusive_with(t.name) == () for t in TOGGLES if t.field != "precision")
    # a caller that ticks both gets the first in the order, as the sidebar's toggleValues does
    assert field_values({"fp16", "bf16"})["accel.precision"] == toggle("bf16").on


def test_the_doctor_and_the_sidebar_use_the_one_list():
    assert ACCELERATIONS == NAMES
    served = form()["toggles"]
    assert served == [t.to_dict() for t in form_toggles()]
    left_to_auto = ("tf32", "tcmalloc")
    assert [t["name"] for t in served] == [n for n in NAMES if n not in left_to_auto], "left to 'auto' in forms"
