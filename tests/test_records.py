"""What a metrics record holds is written once (`ortlab.runfolder.records`): every event has its schema, the
writers write no field it lacks, the fold reads none it lacks, and the chart panels and the server's drawn fields
are derived from it. (A real run's records are held to it in tests/test_metrics_stream.py.)"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import ortlab
from ortlab.runfolder import events, records, stream
from ortlab.runfolder.records import CHARTS, RECORDS, SIDEBAR, TYPES, drawn, panels, unknown_fields
from ortlab.train import metricswriter

PACKAGE = Path(ortlab.__file__).parent


def test_every_event_has_one_schema_of_named_typed_fields():
    assert list(RECORDS) == list(events.EVENTS)
    for event, schema in RECORDS.items():
        assert schema.event == event and schema.doc
        names = schema.names()
        assert len(set(names)) == len(names), f"{event}: a field named twice"
        for f in schema.all_fields():
            assert f.type in TYPES, (event, f)
            assert set(f.drawn) <= {CHARTS, SIDEBAR}, (event, f)
            assert not f.drawn or f.type in ("int", "float"), f"{event}.{f.name}: only numbers are drawn"
            assert (CHARTS in f.drawn and event == events.STEP) == bool(f.title), f"{event}.{f.name}: a panel's title"
    assert records.record_schema()[0]["fields"][0] == {**RECORDS[events.TRAIN_BEGIN].field("event").to_dict()}


def test_the_panels_and_the_drawn_fields_are_derived_from_the_schema():
    from ortlab.server.runindex import DRAWN
    from ortlab.ui.charts import EVAL_CURVES, GPU_PANELS, PANELS

    assert panels() == PANELS and [n for n, _ in PANELS] == list(drawn(events.STEP, CHARTS))
    assert EVAL_CURVES == drawn(events.EVAL, CHARTS) == ("eval_loss",)
    assert GPU_PANELS == ("mfu", "gpu_mem_reserved_mb")  # the drawn fields only some runs write
    assert DRAWN == drawn(events.STEP, SIDEBAR) == ("loss", "samples_per_s")


def test_a_record_with_a_field_its_schema_lacks_is_found():
    step = {"event": "step", "step": 3, "loss": 0.5, "time": 1.0}
    assert unknown_fields(step) == []
    assert unknown_fields({**step, "los": 0.5}) == ["los"]
    assert unknown_fields({"event": "eval", "step": 1, "eval_rouge": 0.3, "phase": "after"}) == []  # eval_*
    assert unknown_fields({"event": "log", "step": 1, "anything": 1}) == []  # the Trainer's own line, passed on
    assert unknown_fields({"event": "nope", "step": 1}) == ["event", "step"]
    with pytest.raises(KeyError):
        RECORDS[events.STEP].field("nope")


def _event_of(node: ast.Dict) -> str | None:
    """The event a dict literal writes (`{"event": events.STEP, ...}`), or None."""
    for key, value in zip(node.keys, node.values, strict=True):
        named = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "events"
        if isinstance(key, ast.Constant) and key.value == "event" and named:
            return getattr(events, value.attr)
    return None


def _written_records() -> list[tuple[str, str, list[str]]]:
    """Every record literal ortlab writes: (where, event, its literal keys)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and (event := _event_of(node)) is not None:
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", event, keys))
    return found


def test_every_record_ortlab_writes_names_only_fields_of_its_schema():
    """The writers' record literals (the metrics writer, the trainer's checks, the lifecycle, Ray Train's restart,
    the chat scorer): a field added to one without the schema fails here."""
    written = _written_records()
    assert {e for _, e, _ in written} >= {events.TRAIN_BEGIN, events.STEP, events.EVAL, events.RESTART, events.AUTO}
    wrong = {where: [k for k in keys if k not in RECORDS[e].names()] for where, e, keys in written}
    assert {k: v for k, v in wrong.items() if v} == {}


def _loop_strings(tree: ast.AST) -> dict[str, set[str]]:
    """For each loop variable that runs over a tuple literal, the strings it takes (`for key in ("a", "b")`, and
    by position: `for key, peak in (("mfu", x), ...)`), over every such loop of the function."""
    loops: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            for i, target in enumerate(targets):
                if isinstance(target, ast.Name):
                    items = [e.elts[i] if isinstance(e, ast.Tuple) else e for e in node.iter.elts]
                    strings = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                    loops.setdefault(target.id, set()).update(strings)
    return loops


def _assigned_keys(fn: object) -> set[str]:
    """The keys a function stores into a dict by subscript: `out["x"] = ...`, and `out[key] = ...` where `key`
    runs over a tuple literal (`for key, peak in (("mfu", ...), ...)`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    loops = _loop_strings(tree)
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript):
                    if isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
                        keys.add(target.slice.value)
                    elif isinstance(target.slice, ast.Name):
                        keys |= loops.get(target.slice.id, set())
    return keys


def test_the_step_writers_device_numbers_are_in_the_schema():
    """The step record's optional numbers (FLOP/s, MFU, and the CUDA-only ones a CPU run never writes) come from
    the writer's own code path: each key it stores is a step field, written only sometimes (`when`)."""
    keys = _assigned_keys(metricswriter.StepMetricsCallback._device_numbers)
    keys |= _assigned_keys(metricswriter.StepMetricsCallback.on_step_end)
    assert {"mfu", "mfu_datasheet", "gpu_mem_reserved_mb", "gpu_util_pct", "workers"} <= keys
    step = RECORDS[events.STEP]
    assert sorted(keys - set(step.names())) == []
    assert all(step.field(k).when for k in keys)


def _keys_read(fn: object, var: str = "r") -> set[str]:
    """The keys a function reads from the record `var`: `r.get("x")`, `r["x"]`, `"x" in r`, and `r[key]` / `key in
    r` where `key` runs over a tuple literal of strings."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    loops = _loop_strings(tree)

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        return loops.get(node.id, set()) if isinstance(node, ast.Name) else set()

    def is_var(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == var

    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if is_var(node.func.value) and node.args:
                keys |= names(node.args[0])
        elif isinstance(node, ast.Subscript) and is_var(node.value):
            keys |= names(node.slice)
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and is_var(node.comparators[0]):
            keys |= names(node.left)
    return keys


def test_the_fold_reads_only_fields_the_schema_names():
    """`stream.RunSummary` (every view's summary) reads fields by name: each is some event's field."""
    read = _keys_read(stream.RunSummary._fold) | _keys_read(stream._Throughput.add) | _keys_read(stream._is_step)
    assert {"step", "loss", "samples_per_s", "max_steps", "resolved", "mfu", "gpu_mem_reserved_mb"} <= read
    known = {name for schema in RECORDS.values() for name in schema.names()}
    assert sorted(read - known) == []
    assert set(stream.EVAL_KEYS) <= set(RECORDS[events.EVAL].names()), "the headline scores are eval fields"
