"""pyproject.toml's floors are tested facts (issue #43): the lowest transformers ortlab declares trains a tiny model
through ortlab, eagerly and with gradient checkpointing (whose argument transformers renamed within 5.x:
`ortlab.train.args.checkpointing_arguments`).

That transformers is installed with `--no-deps` into an overlay folder (tests/helpers/overlays.py) together with the
huggingface_hub and tokenizers it accepts (it refuses, at import, the newer ones in ortlab's environment), and a child
process trains with the overlay first on its path. Below the floor, 5.5 lacks `trackio_static_space_id`, which
ortlab passes; 5.0 and 5.1 lack `train_sampling_strategy` (docs/decisions/notebook-hosts.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import tomllib
from conftest import ROOT
from overlays import env_with, overlay

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
    assert result["eager"] == {"state": "completed", "steps": 4, "checkpointing_applied": False}
    assert result["checkpointing"] == {"state": "completed", "steps": 4, "checkpointing_applied": True}
