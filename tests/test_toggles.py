"""The acceleration vocabulary is one definition (`ortlab.toggles`): every toggle sets a real spec field to values
the spec accepts, what a form writes is what `Mix.requested` reads back, the doctor reports by the same names,
and the server sends the sidebar this very list. Each toggle is a whole record: its availability resolves, its
TrainingArguments exist and read back, and the doctor, forms, trackers, command line and guide hold it."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

from ortlab.accel import ACCELERATIONS, Availability, availability_of
from ortlab.mixrules import Mix, mix_from
from ortlab.spec import AccelSpec, RunSpec
from ortlab.specfields import SpecFields, form
from ortlab.toggles import (
    FIELDS,
    NAMES,
    SECTION,
    TOGGLES,
    Toggle,
    exclusive_with,
    field_values,
    field_values_from,
    form_toggles,
    mix_arguments,
    off_value,
    toggle,
)


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


# --- every toggle is one whole record: each part it must have, and each list that must hold it -----------------

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "accelerations-and-runtimes.md"


def _guide_tables() -> list[list[str]]:
    """The acceleration names of each of the guide's tables of accelerations, in order (their rows start with
    "| `name`"; the guide has two: what each needs, and what runs where)."""
    tables: list[list[str]] = []
    previous_was_row = False
    for line in GUIDE.read_text().splitlines():
        row = re.match(r"\| `([a-z0-9_]+)`", line)
        if row and not previous_was_row:
            tables.append([])
        if row:
            tables[-1].append(row.group(1))
        previous_was_row = bool(row)
    return tables


def _guide_rows() -> list[str]:
    """The names the guide's first table of accelerations lists."""
    return _guide_tables()[0]


def missing_parts(t: Toggle) -> list[str]:
    """What `t` lacks to be a whole acceleration: a part of its own that does not resolve, or a list of the doctor,
    the forms, the trackers, the command line or the guide that does not hold it."""
    from ortlab.cli.options import SPEC_OPTIONS, _choices
    from ortlab.cli.train import train
    from ortlab.probe.groups import GROUPS
    from ortlab.trackers import run_config
    from ortlab.train.args import ORTTrainingArguments

    missing = []
    try:
        found = availability_of(t)
        if not isinstance(found, Availability) or found.name != t.name:
            missing.append(f"availability: {t.availability} does not answer for {t.name}")
    except (ImportError, AttributeError) as e:
        missing.append(f"availability: {t.availability} does not resolve ({e})")
    arguments = {f.name for f in dataclasses.fields(ORTTrainingArguments)}
    for name in (t.argument, *(name for name, _ in t.argument_also)):
        if name not in arguments:
            missing.append(f"arguments: {name} is no TrainingArguments field")
    spec_field = AccelSpec.model_fields.get(t.field)
    if spec_field is None or t.field not in {f.name for f in dataclasses.fields(Mix)}:
        missing.append(f"field: {t.field} is not an AccelSpec field and a Mix field")
    elif t.tuned and "auto" not in _choices(spec_field.annotation):
        missing.append(f"tuned: {t.field} has no 'auto' for a measurement to decide")
    if sum(t.name in names for names in GROUPS.values()) != 1:
        missing.append("probe: no doctor probe group answers for it")
    if t.name not in ACCELERATIONS:
        missing.append("doctor: not a row")
    if t.in_forms and t.to_dict() not in form()["toggles"]:
        missing.append("forms: not drawn")
    if t.field not in run_config(RunSpec(), AccelSpec().resolved({}))["requested_mix"]:
        missing.append("trackers: not recorded")
    option = SPEC_OPTIONS.get(t.field)
    if option is None or option.path != (SECTION, t.field):
        missing.append("cli: no option sets its field")
    elif t.field not in inspect.signature(train).parameters:
        missing.append("cli: `ortlab train` takes no option for it")
    if t.name not in _guide_rows():
        missing.append("docs: not a row of the guide's table")
    return missing


def test_every_toggle_is_a_whole_record():
    assert {t.name: missing_parts(t) for t in TOGGLES} == {t.name: [] for t in TOGGLES}


def test_a_toggle_that_lacks_its_parts_is_caught():
    """The check above can fail: a toggle whose parts do not resolve, and that no list holds, misses each of them."""
    fake = dataclasses.replace(
        toggle("ort"), name="fake", availability="ortlab.accel.nothing", argument="no_such_argument", in_forms=True
    )
    missing = " ".join(missing_parts(fake))
    for part in ("availability:", "arguments:", "probe:", "doctor:", "forms:", "docs:"):
        assert part in missing, (part, missing)
    unrecorded = dataclasses.replace(toggle("ort"), field="no_such_field", availability="ortlab.accel.ort:nothing")
    missing = " ".join(missing_parts(unrecorded))
    for part in ("availability:", "field:", "trackers:", "cli:"):
        assert part in missing, (part, missing)


def test_the_guide_lists_the_toggles_in_order():
    tables = _guide_tables()
    assert len(tables) == 2 and all(rows == list(NAMES) for rows in tables), tables


def test_arguments_read_back_as_the_fields_they_came_from():
    """Each toggle alone, and none: the TrainingArguments its fields set read back as the same fields."""
    off = {f: off_value(f) for f in FIELDS}
    cases = [off, *({**off, t.field: value} for t in TOGGLES for value in (t.on, *t.also_on))]
    for values in cases:
        arguments = SimpleNamespace(**{"fused_adam": False, **mix_arguments(values)})
        assert field_values_from(arguments) == values
        assert mix_from(values).requested() == mix_from(field_values_from(arguments)).requested()
    # what ORTTrainingArguments does with Optimum's name still reads as fused AdamW
    assert field_values_from(SimpleNamespace(**{**mix_arguments(off), "optim": "adamw_torch_fused"}))["fused_adam"]


def test_the_mix_is_built_from_the_fields_in_one_place():
    spec = RunSpec.parse({"accel": {"ort": True, "precision": "auto", "tf32": "auto", "tcmalloc": True}})
    asked = spec.asked_mix()
    assert (asked.ort, asked.precision, asked.tf32, asked.tcmalloc) == (True, "fp32", False, True)
    assert isinstance(mix_from({**{f: off_value(f) for f in FIELDS}, "ort": 1}).ort, bool)


def test_only_the_named_accelerations_have_rules_of_their_own():
    from ortlab.accel.mix import OWN_RULES

    assert set(OWN_RULES) <= set(NAMES)
