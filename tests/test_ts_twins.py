"""The sidebar's TypeScript ports agree with the Python they mirror, on the shared cases of
tests/fixtures/ts_twins.json: node runs the TypeScript sources (tests/ts_twins.mjs, transpiled with the extension's
own `typescript`), Python runs its twins, and the answers are compared.

- The New run form's toggles (`specform.ts` `exclusiveWith`/`toggleValues`) against `ortlab.toggles`
  (`exclusive_with`/`field_values`), on the toggle list the server sends (`GET ortlab/api/spec`).
- The sparklines (`series.ts`) against the server's downsampling (`ortlab.runfolder.downsample.keep_indices` over
  `runindex.DRAWN`). The two bucket differently by design (the server: equal counts of points; the sidebar: equal
  widths in steps, because its history arrives already downsampled: docs/decisions/workbench-and-terminal.md, #35),
  so what is compared is what both promise: the first step and the newest point kept, each drawn number's lowest
  and highest value kept, at most twice the sidebar's `maxPoints` points; and the sidebar draws only points and
  values of the run, in step order. The fields the sparklines draw are the record schema's sidebar fields.

Needs node and the extension's node_modules (`scripts/dev lint` installs them, as CI does before the tests);
without them the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ortlab.runfolder import events
from ortlab.runfolder.downsample import keep_indices
from ortlab.runfolder.records import SIDEBAR, drawn
from ortlab.server.runindex import DRAWN
from ortlab.spec import RunSpec, SpecError
from ortlab.specfields import SpecFields, form, get_path
from ortlab.tasks import TASKS
from ortlab.toggles import exclusive_with, field_values, form_toggles

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = ROOT / "extension"
CASES = Path(__file__).parent / "fixtures" / "ts_twins.json"
RUNNER = Path(__file__).parent / "ts_twins.mjs"


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[dict, dict]:
    """The shared cases (with the toggles as the server sends them) and what the TypeScript answers."""
    node = shutil.which("node")
    if node is None or not (EXTENSION / "node_modules" / "typescript").is_dir():
        why = "needs node and extension/node_modules (run `scripts/dev lint` once)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    cases = json.loads(CASES.read_text())
    cases["toggles"]["list"] = form()["toggles"]
    cases["form"] = form()
    path = tmp_path_factory.mktemp("ts-twins") / "cases.json"
    path.write_text(json.dumps(cases))
    proc = subprocess.run([node, str(RUNNER), str(EXTENSION), str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, json.loads(proc.stdout)


def _click(sequence: list[str]) -> set[str]:
    """Checkboxes ticked in turn as the workbench's mix panel handles them: ticking unticks `exclusive_with`."""
    ticked: set[str] = set()
    for click in sequence:
        if click.startswith("-"):
            ticked.discard(click[1:])
        else:
            ticked.add(click)
            ticked -= set(exclusive_with(click))
    return ticked


def test_the_form_toggles_exclude_and_write_the_same_in_both(shared):
    cases, ts = shared
    assert ts["exclusive"] == {t.name: list(exclusive_with(t.name)) for t in form_toggles()}
    assert any(ts["exclusive"].values()), "the cases must include toggles that exclude each other"
    for sequence, answer in zip(cases["toggles"]["clicks"], ts["clicks"], strict=True):
        ticked = _click(sequence)
        assert answer == {"ticked": sorted(ticked), "values": field_values(ticked)}, sequence
    for names, answer in zip(cases["toggles"]["ticked"], ts["ticked"], strict=True):
        assert answer == field_values(names), names


def test_the_sparklines_draw_the_fields_the_schema_marks_for_the_sidebar(shared):
    _, ts = shared
    assert ts["drawn_fields"] == list(drawn(events.STEP, SIDEBAR)) == list(DRAWN)


def _finite(values: list) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _promised(steps: list, columns: dict[str, list]) -> dict:
    """What both downsamplings promise to keep: the first step, the newest point, each column's extremes."""
    return {
        "first_step": steps[0],
        "newest": [steps[-1], *(column[-1] for column in columns.values())],
        "extremes": {name: [min(_finite(c)), max(_finite(c))] for name, c in columns.items()},
    }


def test_the_sparkline_buckets_keep_what_the_servers_downsampling_keeps(shared):
    cases, ts = shared
    for case, answer in zip(cases["series"], ts["series"], strict=True):
        name, bound = case["name"], 2 * case["max_points"]
        columns = {field: case[field] for field in DRAWN}
        keep = keep_indices(list(columns.values()), bound)
        server = _promised([case["steps"][i] for i in keep], {f: [c[i] for i in keep] for f, c in columns.items()})
        sidebar = _promised(answer["steps"], {f: answer[f] for f in DRAWN})
        assert sidebar == server == _promised(case["steps"], columns), name
        assert len(keep) <= bound and len(answer["steps"]) <= bound, name
        # the sidebar draws the run's own steps, in order, and its own numbers (a bucket's extremes)
        assert answer["steps"] == sorted(set(answer["steps"])) and set(answer["steps"]) <= set(case["steps"]), name
        for field in DRAWN:
            assert set(_finite(answer[field])) <= set(_finite(case[field])), (name, field)
    assert any(len(a["steps"]) < len(c["steps"]) for c, a in zip(cases["series"], ts["series"], strict=True))


def test_the_form_shows_each_task_the_fields_its_record_names(shared):
    _, ts = shared
    assert ts["task_fields"] == {name: list(record.form) for name, record in TASKS.items()}
    assert ts["task_fields"]["preference"] == ["preference.loss", "preference.beta", "preference.reference"]
    fields = SpecFields()
    for path, drawn_as in ts["inputs"].items():
        doc = fields.field(path)
        as_text = [str(c).lower() if isinstance(c, bool) else str(c) for c in doc.choices]
        assert drawn_as["choices"] == as_text, path
        assert (drawn_as["nullable"], drawn_as["zeroIsUnset"]) == (doc.nullable, doc.zero_is_unset), path
        if not doc.choices and isinstance(doc.default, bool):
            assert drawn_as["kind"] == "boolean", path
        elif not doc.choices and isinstance(doc.default, (int, float)):
            assert drawn_as["kind"] in ("number", "integer"), path
    assert ts["inputs"]["preference.loss"]["kind"] == "choice"
    assert ts["inputs"]["preference.beta"]["kind"] == "number"


def _parsed(spec: dict) -> dict:
    return RunSpec.parse(spec).model_dump(mode="json")


def test_the_spec_the_form_posts_parses_as_a_runspec(shared):
    cases, ts = shared
    for task, spec in ts["task_defaults"].items():  # every task, its fields at their defaults
        assert _parsed(spec)["task"] == task, spec
    for case, spec in zip(cases["requests"], ts["requests"], strict=True):
        name = case["name"]
        if "refused" in case:
            with pytest.raises(SpecError, match=re.escape(case["refused"])):
                RunSpec.parse(spec)
            continue
        parsed = _parsed(spec)
        for path, value in case["expect"].items():
            assert get_path(parsed, path) == value, (name, path, spec)
        if not case["run"].get("auto", True):  # the ticked toggles' fields, as ortlab.toggles writes them
            for path, value in field_values(case["run"]["ticked"]).items():
                assert get_path(parsed, path) == value, (name, path, spec)
        # only the chosen task's fields (and every task's size fields) are sent (a spec keeps only what its task
        # reads)
        sent = {*ts["task_fields"][case["run"]["task"]], *ts["size_fields"]}
        typed_elsewhere = set(case["fields"]) - sent
        assert all(get_path(spec, p) is None for p in typed_elsewhere), (name, spec)


def test_the_size_fields_are_the_workbenchs_and_the_estimate_reads_the_same(shared):
    """The sidebar's size fields (max_length and the budget, under max steps and batch size; the workbench's form
    has them too) are drawn as the spec says (a budget of 0 is none); the estimate's line beside Start writes MiB
    and durations as the workbench's note does (estimatetext.ts against ui/estimatenote.py)."""
    pytest.importorskip("ipywidgets")
    from ortlab.ui import estimatenote

    cases, ts = shared
    assert ts["size_fields"] == ["hyper.max_length", "budget.minutes", "budget.memory_gb"]
    for path in ("budget.minutes", "budget.memory_gb"):
        assert ts["inputs"][path]["zeroIsUnset"] and ts["inputs"][path]["kind"] == "number", path
    assert ts["inputs"]["hyper.max_length"]["kind"] == "integer" and not ts["inputs"]["hyper.max_length"]["nullable"]
    assert ts["mib"] == [estimatenote._mib(v) for v in cases["estimate_text"]["mib"]]
    assert ts["duration"] == [estimatenote._duration(v) for v in cases["estimate_text"]["seconds"]]
