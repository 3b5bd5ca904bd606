"""`ortlab --version` and `ortlab info`: what a newcomer (or a bug report) needs to know, at once, no probing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON
from typer.testing import CliRunner

from ortlab import __version__, probe
from ortlab.accel import ACCELERATIONS, Availability, package_version
from ortlab.cli import app
from ortlab.probe import cache

ORTLAB = str(Path(PYTHON).parent / "ortlab")


def test_version():
    out = subprocess.run([ORTLAB, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ortlab {__version__} (Python 3.")
    assert str(Path(PYTHON).parent) in out.stdout


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> Path:
    """An empty doctor cache and a runs folder with one run; any probe subprocess fails the test."""
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "80")

    def no_probes(python: str, group: str):
        raise AssertionError("ortlab info started a probe")

    monkeypatch.setattr(probe, "start_probe", no_probes)
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec

    RunDir.create(tmp_path / "runs", RunSpec())
    return tmp_path


def _info(root: Path, *args: str):
    result = CliRunner().invoke(app, ["info", "--root", str(root), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_info_says_where_and_what_without_probing(isolated):
    data = json.loads(_info(isolated / "runs", "--json"))
    assert data["ortlab"] == __version__
    assert data["executable"] == sys.executable
    assert data["runs_folder"] == str((isolated / "runs").resolve()) and data["runs"] == 1
    assert data["packages"]["torch"] == package_version("torch")
    assert data["packages"]["transformers"] == package_version("transformers")
    assert data["cache"] == str(isolated / "cache")
    assert data["doctor"] is None, "never probed in this (empty) cache"
    text = _info(isolated / "runs")
    assert "not probed in this environment yet: run `ortlab doctor`" in text
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines()), text


def test_info_shows_the_cached_doctor_answer(isolated):
    # A report as the doctor would cache it for this environment (its probes are tested in test_doctor.py).
    accels = {n: Availability(n, n != "fp16", f"{n} reason", "remedy", slow=n == "bf16") for n in ACCELERATIONS}
    facts = probe.fingerprint()
    for group, names in probe.GROUPS.items():
        result = {"accelerations": {n: accels[n].to_dict() for n in names}}
        if group == "torch":
            result["environment"] = {"torch": package_version("torch"), "cuda": None, "devices": []}
        cache.write(facts, cache.GroupAnswer(group, result, "ok", 1_800_000_000.0, 1.0))
    data = json.loads(_info(isolated / "runs", "--json"))
    assert data["doctor"]["fp16"] == {"available": False, "slow": False}
    assert data["doctor"]["bf16"] == {"available": True, "slow": True}
    assert data["doctor_probed_at"] == 1_800_000_000.0
    text = _info(isolated / "runs")
    assert "ort yes" in text and "fp16 no" in text and "bf16 slow" in text


def test_info_with_no_runs_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORTLAB_RUNS", raising=False)
    data = json.loads(_info(tmp_path / "no-such-runs-folder", "--json"))
    assert data["runs"] == 0


def _commands(command, path: tuple[str, ...] = ()):
    """Every command of the CLI (groups included) with the words that reach it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


NARROW = {"COLUMNS": "80", "TERMINAL_WIDTH": "80"}  # click reads COLUMNS; rich (typer's panels) TERMINAL_WIDTH too


def test_help_at_80_columns_shows_every_option_name_whole():
    import typer

    # as a user runs them ...
    for args in ((), ("train",)):
        proc = subprocess.run(
            [ORTLAB, *args, "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, **NARROW}
        )
        assert proc.returncode == 0, proc.stderr
        assert _whole("--max-train-samples" if args else "build-ort-extensions", proc.stdout), proc.stdout
    # ... and every command's help, in this process
    for path, command in _commands(typer.main.get_command(app)):
        result = CliRunner().invoke(app, [*path, "--help"], env=NARROW)
        assert result.exit_code == 0, result.output
        text = result.output
        names = [n for p in command.params for n in (*p.opts, *p.secondary_opts)]
        names += list(getattr(command, "commands", {}))
        cut = [n for n in names if not _whole(n, text)]
        assert not cut, f"`ortlab {' '.join(path)} --help` cuts {cut} at 80 columns:\n{text}"
        assert max(map(len, text.splitlines())) <= 80, text
