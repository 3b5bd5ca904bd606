"""ortlab's children start clean (issue #48, item 3): every Python ortlab starts imports nothing from the folder the
user (or a notebook, or the Jupyter server) is in, and runs in a folder ortlab chose.

The caller's folder here holds planted modules that write a marker when imported: `ortlab` itself (a package that
would shadow ortlab: `python -m` puts the working folder before PYTHONPATH), `typer`, `yaml` and `torch`. Each kind
of child is started from that folder, and no marker may appear. The spec's relative paths (`./model`,
`./train.csv`) must still mean the caller's files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.envvars import child_env
from ortlab.spec import RunSpec

PLANTED = ("typer", "yaml", "torch")


@pytest.fixture
def caller(tmp_path, monkeypatch) -> Path:
    """The user's folder, with planted modules, made the working folder; markers go to tmp_path/markers."""
    folder, markers = tmp_path / "caller", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()

    def plant(path: Path, name: str) -> None:
        path.write_text(f"import pathlib\npathlib.Path({str(markers / name)!r}).write_text('imported')\n")

    for name in PLANTED:
        plant(folder / f"{name}.py", name)
    (folder / "ortlab").mkdir()
    plant(folder / "ortlab" / "__init__.py", "ortlab")
    monkeypatch.chdir(folder)
    return folder


def imported(caller: Path) -> list[str]:
    """The planted modules that some child imported."""
    return sorted(p.name for p in (caller.parent / "markers").iterdir())


def test_the_tcmalloc_restart_of_ortlab_train_imports_nothing_from_the_users_folder(caller, monkeypatch):
    """`ortlab train` starts itself again with tcmalloc preloaded (`python -m ortlab.cli ...`, in the user's folder,
    where the command's relative paths mean something): the new process imports ortlab, typer and yaml from its
    packages, never from that folder."""
    from ortlab.accel import tcmalloc
    from ortlab.cli import common, train

    started: dict = {}

    class Started(Exception):
        pass

    def execve(path, argv, env):
        started.update(path=path, argv=argv, env=env)
        raise Started

    monkeypatch.setattr(common, "WHOLE_PROCESS", True)
    monkeypatch.delenv(train.AGAIN, raising=False)
    monkeypatch.setattr(tcmalloc, "loaded", lambda: None)
    monkeypatch.setattr(tcmalloc, "wanted", lambda setting: True)
    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(sys, "argv", ["ortlab", "--version"])
    with pytest.raises(Started):
        train._allocator(RunSpec())
    # The very command it would start, from the user's folder (`--version`: it imports ortlab.cli, typer and yaml).
    out = subprocess.run(started["argv"], env=started["env"], capture_output=True, text=True, timeout=120)
    assert imported(caller) == [], f"the restarted command imported {imported(caller)} from the user's folder"
    assert out.returncode == 0 and out.stdout.startswith("ortlab "), out.stderr[-2000:]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)], ids=["worker", "torchrun"])
def test_a_launched_run_imports_nothing_from_the_callers_folder_and_reads_its_relative_paths(
    caller, tiny_bert, tmp_path, processes
):
    """A launched worker (one process, or torchrun's agent and its two workers) runs in ortlab's folder with a safe
    path; the spec's `./model` and `./train.csv` are still the caller's: the model is found and checked, and the
    data (a header without rows) is refused naming the caller's file in full."""
    from ortlab.runner import launch

    (caller / "model").symlink_to(tiny_bert)
    (caller / "train.csv").write_text("text,label\n")
    spec = {
        "model": {"name": "./model"},
        "data": {"source": "./train.csv"},
        "hyper": {"max_steps": 1, "batch_size": 2, "max_length": 16},
        "accel": {"ort": False, "fused_adam": False},
        "target": {"processes": processes},
        "output_dir": str(tmp_path / "runs"),
    }
    run = launch(spec)
    run._process.wait(timeout=300)
    assert imported(caller) == [], f"the run imported {imported(caller)} from the caller's folder"
    status = run.status()
    assert status["state"] == "failed", run.dir.log_path.read_text()[-3000:]
    assert str(caller / "train.csv") in status["error"], status["error"]
    assert "no rows" in status["error"], status["error"]
    assert "python -m" not in status["error"]


def test_the_doctors_probes_import_nothing_from_the_callers_folder(caller, tmp_path):
    """A probe group's process (`python -m ortlab.probe`) and, inside the tcmalloc group, the Python it starts with
    the allocator preloaded; and the facts read from another interpreter (`python -c`)."""
    import time

    from ortlab.probe import cache, groups

    proc = groups.start_probe(sys.executable, "tcmalloc")
    _, answer = groups.collect(proc, "tcmalloc", time.monotonic() + 120)
    assert imported(caller) == [], f"the probe imported {imported(caller)} from the caller's folder"
    assert answer.get("outcome", "ok") == "ok", answer

    other = tmp_path / "python"  # the same interpreter by another name: its facts are read in a child
    other.symlink_to(sys.executable)
    facts = cache.fingerprint(str(other))
    assert imported(caller) == [], f"the facts' child imported {imported(caller)} from the caller's folder"
    assert "broken" not in facts, facts


def test_a_tune_candidate_imports_nothing_from_the_callers_folder(caller, tmp_path):
    """tune's measuring children (`python -m ortlab.tune CONFIG`), here given a config that does not exist: it
    starts, imports ortlab, and ends."""
    from ortlab.tune.measure import Stepper

    stepper = Stepper([sys.executable, "-m", "ortlab.tune", str(tmp_path / "missing.json")], tmp_path / "tune.log")
    stepper.proc.wait(timeout=120)
    assert imported(caller) == [], f"the candidate imported {imported(caller)} from the caller's folder"
    assert "No module named" not in (tmp_path / "tune.log").read_text()


def test_ray_jobs_start_with_a_safe_path():
    """A Ray job's entrypoint (`python -m ortlab.job ...`) runs in a folder Ray picks, on the cluster:
    PYTHONSAFEPATH in its runtime environment keeps that folder off its import path, for the local head and any
    other cluster alike."""
    from ortlab.runner.rayjob import _python_for

    for cluster in ("local", "http://127.0.0.1:8265"):
        spec = RunSpec.parse({"target": {"cluster": cluster}})
        _, runtime_env = _python_for(spec)
        assert runtime_env["env_vars"].get("PYTHONSAFEPATH") == "1", (cluster, runtime_env)


def test_an_empty_pythonpath_entry_does_not_bring_the_working_folder_back(caller, monkeypatch):
    """`PYTHONPATH=$PYTHONPATH:/x` with PYTHONPATH unset leaves an empty entry, which Python reads as the working
    folder whatever PYTHONSAFEPATH says: a child started even in the caller's folder imports nothing from it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", "import yaml, typer"], env=child_env(), cwd=caller, capture_output=True, text=True
    )
    assert imported(caller) == [], f"imported {imported(caller)} from the working folder"
    assert out.returncode == 0, out.stderr


def test_the_childrens_folder_is_private_and_not_the_callers(caller):
    from ortlab.envvars import child_cwd

    folder = Path(child_cwd())
    assert folder != caller and folder.is_dir() and not folder.is_symlink()
    assert folder.stat().st_uid == os.getuid() and folder.stat().st_mode & 0o077 == 0


def test_anchored_names_local_paths_in_full_and_leaves_hub_ids(caller):
    """The readers look on disk first: what names something in the caller's folder, or starts with '.' or '~',
    is a local path; a Hub id or an embedded dataset is not."""
    (caller / "data.csv").write_text("text,label\n")
    (caller / "org").mkdir()
    (caller / "org" / "model").mkdir()
    cases = {
        ("./model", "./data.csv"): (str(caller / "model"), str(caller / "data.csv")),
        ("org/model", "data.csv"): (str(caller / "org" / "model"), str(caller / "data.csv")),
        ("bert-base-uncased", "embedded:rotten-tomatoes"): ("bert-base-uncased", "embedded:rotten-tomatoes"),
        ("other/model", "stanfordnlp/imdb"): ("other/model", "stanfordnlp/imdb"),
        ("/abs/model", "~/data.csv"): ("/abs/model", os.path.expanduser("~/data.csv")),
        ("../up", "missing.csv"): (str(caller.parent / "up"), "missing.csv"),
    }
    for (model, data), want in cases.items():
        spec = RunSpec.parse({"model": {"name": model}, "data": {"source": data}}).anchored(caller)
        assert (spec.model.name, spec.data.source) == want, (model, data)
