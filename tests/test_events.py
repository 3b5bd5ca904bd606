"""The metrics stream's event names are one set of constants (`ortlab.runfolder.events`), and every writer and
reader in ortlab names them from there."""

from __future__ import annotations

import ast
from pathlib import Path

import ortlab
from ortlab.runfolder import events


def _bare_event_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module writes `{"event": "<literal>"}` or compares an event with a literal string."""

    def is_event(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "event"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event"
        return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "event"

    def strings(node: ast.AST) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "event":
                    found += [(node.lineno, s) for s in strings(value)]
        elif isinstance(node, ast.Compare) and is_event(node.left):
            for right in node.comparators:
                found += [(node.lineno, s) for s in strings(right)]
    return found


def test_the_metrics_events_are_named_from_one_module():
    """Every writer and reader of the metrics stream names its events by `ortlab.runfolder.events`: a bare string
    would go on comparing against an old name after a rename. (`ortlab.tune`'s child process speaks its own
    protocol to its parent over a pipe, not the metrics stream.)"""
    assert len(set(events.EVENTS)) == len(events.EVENTS) and set(events.WITH_ACCELERATIONS) <= set(events.EVENTS)
    package = Path(ortlab.__file__).parent
    assert _bare_event_strings(ast.parse('r.get("event") == "step" or {"event": "eval"}')) == [(1, "step"), (1, "eval")]
    bare = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if not rel.startswith("tune/"):
            bare.update({f"{rel}:{line}": s for line, s in _bare_event_strings(ast.parse(path.read_text()))})
    assert bare == {}, f"event names written as bare strings (use ortlab.runfolder.events): {bare}"
