"""The `ortlab` command line. Each command is a thin layer over the Python API of the same name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="ortlab: fine-tune Hugging Face models fast, with ONNX Runtime training and friends.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    python: Annotated[Path | None, typer.Option(help="probe another Python environment (its interpreter path)")] = None,
) -> None:
    """What this environment can run: each acceleration, available or not, with the reason and the remedy."""
    from ortlab.probe import doctor as run_doctor

    report = run_doctor(python=str(python) if python else None)
    if json_out:
        print(report.to_json())
    else:
        report.render()


@app.command("build-ort-extensions")
def build_ort_extensions(
    force: Annotated[bool, typer.Option(help="rebuild even if they look up to date")] = False,
) -> None:
    """Compile ORTModule's two CPU torch extensions into the installed onnxruntime-training (~3 min)."""
    from ortlab.accel.ort import build_extensions

    try:
        built = build_extensions(force=force)
    except RuntimeError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo("ORTModule extensions built" if built else "ORTModule extensions already built: nothing to do")


def main() -> None:
    app(prog_name="ortlab")


if __name__ == "__main__":
    sys.exit(main())
