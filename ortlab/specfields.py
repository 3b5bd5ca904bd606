"""RunSpec's fields as the faces show them, read from RunSpec's own JSON schema.

The workbench's widgets and the JupyterLab sidebar's form (through the server's `GET ortlab/api/spec`) take a
field's choices, default and description from here, never from a copy: a task added to `ortlab.spec.Task`, or a
description reworded there, reaches every face without touching it. Only pydantic and the spec are needed (no
torch): the server answers from this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortlab.spec import RunSpec
from ortlab.tasks import TASKS
from ortlab.toggles import form_toggles


@dataclass(frozen=True)
class FieldDoc:
    """One leaf field of the spec, by dotted path ("hyper.learning_rate")."""

    path: str
    description: str
    default: Any
    # The values the field allows when they are a closed set (an enum, a Literal, `bool | "auto"`); () otherwise.
    choices: tuple[Any, ...]
    nullable: bool
    # A number that must be > 0 but may be null (max_steps, max_train_samples): a form's 0 means "unset".
    zero_is_unset: bool


def schema() -> dict[str, Any]:
    """RunSpec's JSON schema (pydantic's, as `ortlab spec --schema` prints it)."""
    return RunSpec.json_schema()


def defaults() -> dict[str, Any]:
    """The spec a form starts from: every field's default, as JSON. The schema alone misses some (a section
    built by a factory, such as data's capped embedded dataset), so the defaults come from a real default spec.
    A spec validates only itself, so this asks nothing of the machine (no torch)."""
    return RunSpec.parse({}).model_dump(mode="json")


def form() -> dict[str, Any]:
    """What a form needs to draw the spec (the server's `GET ortlab/api/spec`): the schema, the defaults, the
    acceleration toggles with the fields they set (`ortlab.toggles`: the sidebar keeps no copy of them), and each
    task with the spec fields its form shows (`ortlab.tasks.Task.form`)."""
    return {
        "schema": schema(),
        "defaults": defaults(),
        "toggles": [t.to_dict() for t in form_toggles()],
        "tasks": [t.to_dict() for t in TASKS.values()],
    }


class SpecFields:
    """Look fields up by path in one schema and one set of defaults (read once per form)."""

    def __init__(self, schema_: dict[str, Any] | None = None, defaults_: dict[str, Any] | None = None):
        self.schema = schema() if schema_ is None else schema_
        self.defaults = defaults() if defaults_ is None else defaults_

    def _node(self, path: str) -> dict[str, Any]:
        node: dict[str, Any] = self.schema
        for part in path.split("."):
            node = self._deref(node)
            props = node.get("properties", {})
            if part not in props:
                raise KeyError(f"RunSpec has no field {path!r}")
            node = props[part]
        return node

    def _deref(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        name = ref.rsplit("/", 1)[-1]
        # Keep what the referring property adds (its description) over the referred model's own.
        return {**self.schema["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}

    def field(self, path: str) -> FieldDoc:
        node = self._node(path)
        branches = node.get("anyOf", [node])
        choices: list[Any] = []
        nullable = False
        zero_is_unset = False
        for b in branches:
            if b.get("type") == "null":
                nullable = True
                continue
            if "enum" in b:
                choices.extend(b["enum"])
            elif "const" in b:
                choices.append(b["const"])
            elif b.get("type") == "boolean" and len(branches) > 1:  # bool | "auto": the booleans are choices too
                choices.extend([True, False])
            if b.get("exclusiveMinimum") == 0:
                zero_is_unset = True
        return FieldDoc(
            path=path,
            description=node.get("description", ""),
            default=get_path(self.defaults, path),
            choices=tuple(choices),
            nullable=nullable,
            zero_is_unset=zero_is_unset and nullable,
        )

    def description(self, path: str) -> str:
        return self.field(path).description

    def choices(self, path: str) -> tuple[Any, ...]:
        return self.field(path).choices

    def tip(self, path: str) -> str:
        """The field's description as a tooltip, saying what a form's empty value means."""
        f = self.field(path)
        if f.zero_is_unset:
            return f"{f.description} (0: not set)"
        return f.description

    def value(self, path: str, raw: Any) -> Any:
        """A form widget's value as the spec field at `path` wants it: text stripped, an empty text of a nullable
        field (or the 0 of a nullable positive number) is None, a tuple of choices a list."""
        f = self.field(path)
        if isinstance(raw, str):
            raw = raw.strip()
        if isinstance(raw, tuple):
            return list(raw)
        if f.nullable and (raw == "" or (f.zero_is_unset and raw == 0)):
            return None
        return raw


def get_path(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a spec dict (None when a section is missing)."""
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path of a spec dict, making the sections on the way (copies: the caller's sections are
    shared with the form's starting spec, which must not change)."""
    *sections, last = path.split(".")
    node = data
    for part in sections:
        node[part] = dict(node.get(part) or {})
        node = node[part]
    node[last] = value
