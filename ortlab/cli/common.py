"""What every command module shares: the help layout, the one place errors become messages, the runs folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ortlab.errors import OrtlabError
from ortlab.safeio import real_number

# The command owns its process (the console script, not `app` called from Python, a test's CliRunner included):
# only then may `ortlab train` start itself again with another allocator (`ortlab.cli.train`).
WHOLE_PROCESS = False


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

    def invoke(self, ctx: Any) -> Any:
        # Every command's OrtlabError ends here (a command with an exit code of its own catches it first, through
        # `reported`): its message, no traceback. Anything else keeps its traceback: it is a bug.
        with reported():
            return super().invoke(ctx)


# Help is click's plain layout, not typer's rich panels: those split 76 columns among six table columns (option,
# short option, --no- option, its short form, type, help) and, at 80 columns, cut option names short
# (`--max-train-sampl…`); they also read help text as rich markup (`ortlab[ui]` lost its `[ui]`). Click wraps the
# descriptions and never cuts a name (a long one gets its description on the next line).
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None, "cls": Commands}


@contextmanager
def reported(*also: type[Exception], code: int = 2) -> Iterator[None]:
    """THE one place the CLI turns an error into `error: <message>` on stderr and exit `code` (no traceback).

    Catches `OrtlabError` (its message is for the user: what was wrong and how to fix it) and the few library
    errors a command names in `also` (compare's ValueError, build-ort-extensions' RuntimeError). Anything else is
    a bug and keeps its traceback. The message may quote a spec, a path or a run folder: control characters are
    removed and rich markup is escaped, so it prints as written.
    """
    try:
        yield
    except (OrtlabError, *also) as e:
        from rich.console import Console
        from rich.markup import escape

        from ortlab.chat import strip_controls

        console = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
        console.print(f"error: {escape(strip_controls(str(e)))}")  # uncoloured: `error: ` reads the same everywhere
        raise typer.Exit(code) from None


def num(value: object, fmt: str) -> str:
    """A metric for a terminal line: NaN/inf (written as null) or a missing field shows as '-', never a crash."""
    number = real_number(value)
    if number is not None:
        return format(number, fmt)
    return "-" if value is None or isinstance(value, (int, float)) else str(value)


RootOption = Annotated[
    Path | None, typer.Option(help="folder holding the runs (default: $ORTLAB_RUNS or ./ortlab-runs)")
]
RunArgument = Annotated[str, typer.Argument(help="run id or folder")]


def run_named(run_id: str, root: Path | None) -> Any:
    """The run `run_id` names under `root` (a `ortlab.runner.Run`, by `ortlab.attach`); an unknown or damaged one
    is a user error."""
    from ortlab.runner import attach

    with reported():
        return attach(run_id, root)
