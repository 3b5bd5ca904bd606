"""The one table of the command-line options that set a RunSpec field (`train`'s and `tune`'s alike).

An option's help is the field's own `description` (with the choices of a Literal field, its default and the spec
path it sets), read from the RunSpec when the help is shown: a field described once, in `ortlab/spec.py`, reads
the same in `--help`, the JSON schema, the notebook form and the sidebar. Only the option NAMES are the command
line's own (short: `--lr`, `--lora`), and a note where a flag sets a field other than by its value.

`ortlab.spec` is imported only where a spec is needed (here: the help, and building a spec): building its pydantic
models would add 0.5-1 s to the start of every command, `ortlab runs` and `ortlab --version` included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import typer
from typer.core import TyperCommand, TyperOption

from ortlab.toggles import SECTION, TOGGLES

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

    from ortlab.spec import RunSpec


def _names(values: list[str] | None) -> list[str] | None:
    """A repeatable option that also takes comma lists: `--report-to a,b --report-to c` -> [a, b, c]."""
    return None if values is None else [n for v in values for n in map(str.strip, v.split(",")) if n]


@dataclass(frozen=True)
class SpecOption:
    """A command-line option that sets one RunSpec field."""

    path: tuple[str, ...]  # the field it sets, e.g. ("hyper", "learning_rate")
    decls: tuple[str, ...] = ()  # its names when not just --<parameter-name>, e.g. ("--lr", "--learning-rate")
    convert: Callable[[Any], Any] | None = None  # the field's value from the option's, when they differ
    how: str = ""  # how the option sets the field, when not by its value (said in the help)


def _toggle_options() -> dict[str, SpecOption]:
    """One option per acceleration field (`ortlab.toggles`), named as the field: a switch (a toggle whose `on` is
    True) is `--x/--no-x`, another field (zero_stage, precision) takes its value."""
    options: dict[str, SpecOption] = {}
    for t in TOGGLES:
        dashed = t.field.replace("_", "-")
        options.setdefault(t.field, SpecOption((SECTION, t.field), (f"--{dashed}/--no-{dashed}",) if t.flag else ()))
    return options


# The option's parameter name (in `train` and `tune`) -> the field it sets. Each command builds its overrides from
# its own parameters with `overrides(locals())`, so an option is mapped to the spec once, here.
SPEC_OPTIONS: dict[str, SpecOption] = {
    "model": SpecOption(("model", "name")),
    "data": SpecOption(("data", "source")),
    "task": SpecOption(("task",)),
    "text_column": SpecOption(("data", "text_column")),
    "label_column": SpecOption(("data", "label_column")),
    "source_column": SpecOption(("data", "source_column")),
    "target_column": SpecOption(("data", "target_column")),
    "messages_column": SpecOption(("data", "messages_column")),
    "prompt_column": SpecOption(("data", "prompt_column")),
    "response_column": SpecOption(("data", "response_column")),
    "packing": SpecOption(("data", "packing"), ("--packing/--no-packing",)),
    "preference_loss": SpecOption(("preference", "loss")),
    "beta": SpecOption(("preference", "beta")),
    "reference": SpecOption(("preference", "reference")),
    "max_train_samples": SpecOption(("data", "max_train_samples")),
    "max_eval_samples": SpecOption(("data", "max_eval_samples")),
    "epochs": SpecOption(("hyper", "epochs")),
    "max_steps": SpecOption(("hyper", "max_steps")),
    "learning_rate": SpecOption(("hyper", "learning_rate"), ("--lr", "--learning-rate")),
    "batch_size": SpecOption(("hyper", "batch_size")),
    "max_length": SpecOption(("hyper", "max_length")),
    "max_target_length": SpecOption(("hyper", "max_target_length")),
    "gradient_checkpointing": SpecOption(
        ("hyper", "gradient_checkpointing"), ("--gradient-checkpointing/--no-gradient-checkpointing",)
    ),
    **_toggle_options(),
    "tune": SpecOption(
        ("accel", "tune"), ("--tune",), lambda on: "measure" if on else None, how="--tune sets 'measure'"
    ),
    "lora": SpecOption(
        ("adapter", "kind"),
        ("--lora/--no-lora",),
        lambda on: None if on is None else "lora" if on else "none",
        how="--lora sets 'lora', --no-lora 'none'",
    ),
    "adapter_rank": SpecOption(("adapter", "rank"), how="with --lora"),
    "report_to": SpecOption(("report_to",), ("--report-to",), _names, how="repeat it, or give a comma list"),
    "budget_minutes": SpecOption(("budget", "minutes")),
    "budget_memory_gb": SpecOption(("budget", "memory_gb")),
    "output_dir": SpecOption(("output_dir",)),
    "name": SpecOption(("name",)),
    "seed": SpecOption(("seed",)),
    "cluster": SpecOption(("target", "cluster")),
    "processes": SpecOption(("target", "processes")),
    "storage": SpecOption(("target", "storage")),
    "max_failures": SpecOption(("target", "max_failures")),
}


def spec_field(path: tuple[str, ...]) -> FieldInfo:
    """The RunSpec field at `path` (its description, type and default), through the nested spec models."""
    from ortlab.spec import RunSpec

    model: type[BaseModel] = RunSpec
    for key in path[:-1]:
        model = model.model_fields[key].annotation  # type: ignore[assignment]  # a nested spec, e.g. HyperSpec
    return model.model_fields[path[-1]]


def _choices(annotation: Any) -> list[Any]:
    """The values a Literal field takes (through unions: `bool | Literal['auto']` -> ['auto'])."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [value for arg in get_args(annotation) for value in _choices(arg)]


def _shown(value: Any) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def spec_help(name: str) -> str:
    """An option's help: its field's description, the choices of a Literal field, the default, the spec path."""
    from pydantic_core import PydanticUndefined

    option = SPEC_OPTIONS[name]
    field = spec_field(option.path)
    text = (field.description or "").strip()
    choices = _choices(field.annotation)
    # A flag's help names no choices (`--ort/--no-ort` takes none; `bool | 'auto'`'s 'auto' is leaving it out).
    if choices and option.convert is None and bool not in get_args(field.annotation):
        text += f" One of: {', '.join(map(str, choices))}."
    notes = [".".join(option.path)]
    if option.how:
        notes.append(option.how)
    elif field.default is not PydanticUndefined and field.default is not None:
        notes.append(f"default: {_shown(field.default)}")
    return f"{text} [{'; '.join(notes)}]"


def spec_option(name: str) -> Any:
    """The `typer.Option` of the table's option `name` (`Annotated[T, spec_option(..)]`); `SpecHelp` writes its help."""
    return typer.Option(*SPEC_OPTIONS[name].decls)


class SpecHelp(TyperCommand):
    """A command taking spec options (`train`, `tune`): their help is `spec_help`, written when the help is shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.params:
            if isinstance(param, TyperOption) and param.name in SPEC_OPTIONS:
                param.help = spec_help(param.name)
        super().format_help(ctx, formatter)


def overrides(options: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The spec fields a command's options set (None: not given), from its parameters (`locals()`)."""
    return {
        option.path: (option.convert or (lambda v: v))(options[name])
        for name, option in SPEC_OPTIONS.items()
        if name in options
    }


SpecFile = Annotated[Path | None, typer.Argument(help="a RunSpec as YAML or JSON (default: the embedded default)")]


def build_spec(spec_file: Path | None, given: dict[tuple[str, ...], Any]) -> RunSpec:
    """The spec file (or the embedded default) with the command line's options (`overrides`) on top."""
    from ortlab.spec import RunSpec

    base = read_spec_file(spec_file) if spec_file is not None else RunSpec().model_dump(mode="json")
    data = given.get(("data", "source"))
    if data is not None and spec_file is None:
        base["data"] = {"source": data}  # a new dataset starts from the data defaults, not the demo's caps
    for path, value in given.items():
        if value is None:
            continue
        node = base
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return RunSpec.parse(base)


def read_spec_file(path: Path) -> dict:
    """A spec file's fields, before validation; a missing or unparsable file is a SpecError that says so."""
    import yaml

    from ortlab import safeyaml
    from ortlab.spec import SpecError, cut, read_spec_text

    text = read_spec_text(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else safeyaml.load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        what = "JSON" if path.suffix == ".json" else "YAML ortlab reads"
        raise SpecError([f"{path}: not {what}: {cut(str(e), 160)}"]) from None
    if not isinstance(data, dict):
        raise SpecError([f"{path}: a spec is a mapping of fields, got {type(data).__name__}"])
    return data
