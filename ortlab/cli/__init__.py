"""The `ortlab` command line. Each command is a thin layer over the Python API of the same name.

The commands live by group in `env` (this environment), `train` (making runs) and `runs` (runs that exist); the
options that set RunSpec fields in `options` (one table, help from the spec); what they share, the error catch
included, in `common`. This module makes the app and lists every command once, in the order `--help` shows them.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ortlab.cli import common, env, estimate, runs, serve, train
from ortlab.cli.common import PLAIN_HELP
from ortlab.cli.options import SpecHelp

app = typer.Typer(
    help="ortlab: fine-tune Hugging Face models fast, with ONNX Runtime training and friends.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)


def _show_version(value: bool) -> None:
    if value:
        import platform

        from ortlab import __version__

        typer.echo(f"ortlab {__version__} (Python {platform.python_version()}, {sys.executable})")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """ortlab: fine-tune Hugging Face models fast, with ONNX Runtime training and friends."""


app.command()(env.info)
app.command("doctor")(env.doctor_command)
app.command("build-ort-extensions")(env.build_ort_extensions)
app.command("bundle")(env.bundle_command)
app.command(cls=SpecHelp)(train.train)
app.command("tune", cls=SpecHelp)(train.tune_cmd)
app.command("estimate", cls=SpecHelp)(estimate.estimate_cmd)
app.command("runs")(runs.list_runs)
app.command()(runs.follow)
app.command("stop")(runs.stop_run)
app.command()(runs.resume)
app.command("compare")(runs.compare_runs)
app.command()(runs.export)
app.command()(runs.push)
app.command()(serve.serve)
app.command()(train.notebook)
app.command()(train.spec)
app.add_typer(env.runtime_app, name="runtime")
app.add_typer(env.cluster_app, name="cluster")


def main() -> None:
    """The console script `ortlab` (and `python -m ortlab.cli`)."""
    common.WHOLE_PROCESS = True
    app(prog_name="ortlab")


__all__ = ["app", "main"]
