"""One error base: every error ortlab raises for its user is an `OrtlabError` (and keeps its built-in base), and
the faces turn one into its message, never a traceback; anything else keeps its traceback (it is a bug)."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

import ortlab
from ortlab.errors import OrtlabError

ORTLAB = str(Path(PYTHON).parent / "ortlab")
# Not for the user: ORTModule's probe raises it to choose a path, and catches it itself.
INTERNAL = {"ortlab.accel.ort_capture.ForwardNotCapturable"}


def error_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined at the top of any ortlab module (warnings are not errors), by its name."""
    found = {}
    for info in pkgutil.walk_packages(ortlab.__path__, "ortlab."):
        if info.name.endswith(".__main__"):  # a command's entry point: importing it runs the command
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and issubclass(cls, BaseException) and not issubclass(cls, Warning):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_error_ortlab_raises_is_an_ortlab_error_with_its_builtin_base():
    classes = error_classes()
    # the walk sees the whole package (a walk that found nothing would pass vacuously)
    for name in ("ortlab.spec.SpecError", "ortlab.safeio.UnsafePath", "ortlab.runner.launcher.RunError"):
        assert name in classes, sorted(classes)
    forgot = sorted(n for n, c in classes.items() if n not in INTERNAL and not issubclass(c, OrtlabError))
    assert not forgot, f"derive these from ortlab.errors.OrtlabError (and keep their built-in base): {forgot}"
    # old `except ValueError` / `except OSError` code still catches them
    from ortlab.accel.mix import MixError
    from ortlab.safeio import TooLarge, UnsafePath
    from ortlab.spec import SpecError

    assert issubclass(SpecError, ValueError) and issubclass(MixError, ValueError)
    assert issubclass(UnsafePath, OSError) and issubclass(TooLarge, OSError)


def test_cli_prints_a_bad_spec_cleanly_and_exits_2(tmp_path):
    """A hostile spec: an unknown field whose name carries an escape sequence and rich markup. The user reads the
    problem, exit code 2, no traceback; the terminal gets no escape sequence and the markup as written."""
    spec = tmp_path / "spec.yaml"
    spec.write_text('"bogus\\e[2J[bold]field[/bold]": 1\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [ORTLAB, "train", str(spec), "--output-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: invalid run spec"), proc.stderr[-2000:]
    assert "bogus[2J[bold]field[/bold]: unknown field" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


# A command of the real CLI machinery (its command group) that raises what it is told to.
RAISER = """
import sys
import typer
from ortlab.cli import PLAIN_HELP
from ortlab.errors import OrtlabError

class Custom(OrtlabError, ValueError):
    pass

app = typer.Typer(pretty_exceptions_enable=False, **PLAIN_HELP)

@app.command()
def ortlab_error():
    raise Custom("the [red]field[/red] x is wrong:\\n  - set it to 1")

@app.command()
def bug():
    raise KeyError("boom")

app(sys.argv[1:], prog_name="ortlab")
"""


def test_cli_shows_any_ortlab_error_as_its_message_and_anything_else_with_a_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", RAISER, command], capture_output=True, text=True, timeout=120, env=env
        )

    said = run("ortlab-error")
    assert said.returncode == 2, said.stderr
    assert said.stderr == "error: the [red]field[/red] x is wrong:\n  - set it to 1\n"
    bug = run("bug")
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'boom'" in bug.stderr, bug.stderr


def test_the_workbench_shows_a_launch_error_in_its_message_area(tmp_path):
    """A spec that validates but cannot start (its interpreter is missing): said under Launch, not raised."""
    pytest.importorskip("ipywidgets")
    from ortlab.ui import Workbench

    wb = Workbench(root=str(tmp_path / "runs"))
    try:
        wb.where.value = "other Python"
        wb.python.value = str(tmp_path / "no-<b>python</b>")
        assert wb.validate()
        assert wb.launch() is None
        assert "cannot launch" in wb.problems.value and "is not an executable file" in wb.problems.value
        assert "no-&lt;b&gt;python&lt;/b&gt;" in wb.problems.value  # escaped: the path is the user's text
    finally:
        wb.monitor.close()
