"""pyproject.toml's floors are tested facts (issue #43): the lowest transformers ortlab declares trains a tiny model
through ortlab, eagerly and with gradient checkpointing (whose argument transformers renamed within 5.x:
`ortlab.train.args.checkpointing_arguments`).

That transformers is installed with `--no-deps` into an overlay folder (tests/helpers/overlays.py) together with the
huggingface_hub and tokenizers it accepts (it refuses, at import, the newer ones in ortlab's environment), and a child
process trains with the overlay first on its path. Below the floor, 5.5 lacks `trackio_static_space_id`, which
ortlab passes; 5.0 and 5.1 lack `train_sampling_strategy` (docs/decisions/notebook-hosts.md).

The other floors are tested together: a Python 3.11 venv with every direct dependency of `ortlab[llm]` at its floor
(tests/helpers/floorvenv.py, cached outside the clone) installs this checkout, runs its CLI and trains the same tiny
model. The floors raised by that test, with the failure each one showed, are in docs/decisions/notebook-hosts.md."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pytest
import tomllib
from colablike import _uv, bare_env, copy_of, versions
from conftest import ROOT
from floorvenv import floor_venv, floors
from overlays import env_with, overlay
from packaging.version import Version

# What the floor's transformers accepts of its two pinned dependencies (its own Requires-Dist): the newest of each.
FLOOR_COMPANIONS = ["huggingface_hub==1.33.0", "tokenizers==0.22.2"]


def declared_floor(package: str) -> str:
    """The `>=` version pyproject.toml declares for `package`."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(rf"{package}\b", d)]
    return re.search(r">=\s*([\w.]+)", spec).group(1)


def test_the_floor_is_a_full_version():
    assert re.fullmatch(r"5\.\d+(\.\d+)?", declared_floor("transformers"))


@pytest.mark.slow
def test_the_lowest_declared_transformers_trains(tmp_path):
    floor = declared_floor("transformers")
    version = floor if floor.count(".") == 2 else f"{floor}.0"
    site = overlay(f"transformers-{version}", [f"transformers=={version}", *FLOOR_COMPANIONS])
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "tiny_training.py")],
        env={**env_with(site), "HF_HUB_OFFLINE": "1", "ORTLAB_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"] == version, "the child did not import the overlay's transformers"
    assert_trained(result)


def assert_trained(result: dict) -> None:
    """Both tiny runs completed their 4 steps with a finite loss, and checkpointing was applied only where asked."""
    for name, checkpointing in (("eager", False), ("checkpointing", True)):
        run = dict(result[name])
        loss = run.pop("loss")
        assert run == {"state": "completed", "steps": 4, "checkpointing_applied": checkpointing}, name
        assert isinstance(loss, float) and math.isfinite(loss), f"{name}: last loss {loss!r}"


def test_every_dependency_has_a_floor():
    assert {"torch", "transformers", "numpy", "peft"} <= floors().keys()
    assert all(re.fullmatch(r"\d+(\.\d+)*", f) for f in floors().values()), floors()


@pytest.mark.slow
def test_the_lowest_declared_versions_train(tmp_path):
    """Every direct dependency at its floor: installed exactly there, the CLI starts, a tiny model trains."""
    start = time.monotonic()
    cached, built_s = floor_venv()
    venv = copy_of(cached, tmp_path / "venv")
    python, env = venv / "bin" / "python", {**bare_env(), "HF_HUB_OFFLINE": "1"}
    # This checkout's ortlab, as a user installs it (the cached venv has only its dependencies).
    subprocess.run([_uv(), "pip", "install", "-q", "--python", str(python), "--no-deps", str(ROOT)],
                   check=True, capture_output=True, env=env, timeout=600)  # fmt: skip
    wanted = floors()
    found = versions(python, tuple(wanted))
    wrong = {n: (found[n], f) for n, f in wanted.items() if found[n] is None or Version(found[n]) != Version(f)}
    assert not wrong, f"installed (found, floor) differ from pyproject.toml's floors: {wrong}"

    cli = subprocess.run([str(venv / "bin" / "ortlab"), "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert cli.returncode == 0 and "run" in cli.stdout, cli.stderr[-4000:]
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "helpers" / "tiny_training.py")],
        env={**env, "ORTLAB_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"] == found["transformers"]
    assert_trained(result)
    times = ROOT / "test-artifacts" / "floors" / "times.json"
    times.parent.mkdir(parents=True, exist_ok=True)
    record = json.loads(times.read_text()) if times.is_file() else {}
    record["cold" if built_s else "warm"] = {"build_s": round(built_s, 1), "test_s": round(time.monotonic() - start, 1),
                                             "venv": cached.name, "versions": found}  # fmt: skip
    times.write_text(json.dumps(record, indent=2) + "\n")
