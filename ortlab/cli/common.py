"""What every command module shares: the help layout, the one place errors become messages, the runs folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup


class Commands(TyperGroup):
    """Lists each command with its whole first sentence, wrapped: click cuts it to one line ("the...")."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Help is click's plain layout, not typer's rich panels: those split 76 columns among six table columns (option,
# short option, --no- option, its short form, type, help) and, at 80 columns, cut option names short
# (`--max-train-sampl…`); they also read help text as rich markup (`ortlab[ui]` lost its `[ui]`). Click wraps the
# descriptions and never cuts a name (a long one gets its description on the next line).
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None, "cls": Commands}


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean 'your input is wrong' (shown as one clear message), not 'ortlab is broken'.

    Once every one of them derives from `ortlab.errors.OrtlabError`, this tuple is `(OrtlabError,)`."""
    from ortlab.accel.mix import MixError
    from ortlab.assets import AssetMissing
    from ortlab.data import DataError
    from ortlab.runner import RunError
    from ortlab.spec import SpecError
    from ortlab.tasks import ModelError

    return (SpecError, DataError, ModelError, MixError, AssetMissing, RunError)


@contextmanager
def reported(*also: type[Exception], code: int = 2) -> Iterator[None]:
    """THE one place the CLI turns an error into `error: <message>` on stderr and exit `code` (no traceback).

    Catches the user errors (`user_errors()`) and the command's own error classes `also` (those its API raises
    for bad input: BundleError, ExportError, ...). Anything else is a bug and keeps its traceback. The message
    is the library's, which may quote a run folder or a file: control characters (escape sequences) are removed.
    """
    try:
        yield
    except (*user_errors(), *also) as e:
        from ortlab.chat import strip_controls

        typer.echo(f"error: {strip_controls(str(e))}", err=True)
        raise typer.Exit(code) from None


def num(value: object, fmt: str) -> str:
    """A metric for a terminal line: NaN/inf (written as null) or a missing field shows as '-', never a crash."""
    import math

    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, fmt)
    return "-" if value is None else str(value)


RootOption = Annotated[
    Path | None, typer.Option(help="folder holding the runs (default: $ORTLAB_RUNS or ./ortlab-runs)")
]
RunArgument = Annotated[str, typer.Argument(help="run id or folder")]


def attach(run_id: str, root: Path | None) -> Any:
    """The run `run_id` names under `root` (a `ortlab.runner.Run`); an unknown or damaged one is a user error."""
    from ortlab.runner import attach as attach_run

    with reported():
        return attach_run(run_id, root)
