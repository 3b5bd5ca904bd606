"""`import ortlab` must stay fast and light: notebooks, the CLI and the Jupyter server extension import it."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PYTHON

HEAVY = ("torch", "transformers", "datasets", "deepspeed", "onnxruntime", "numpy", "pydantic", "typer")


def _import_in_fresh_interpreter(code: str) -> dict:
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_is_fast_and_imports_no_heavy_library():
    # Best of three fresh interpreters: the number is about ortlab, not about a busy machine's worst moment.
    code = (
        "import json, sys, time; t = time.perf_counter(); import ortlab; dt = time.perf_counter() - t; "
        f"print(json.dumps({{'dt': dt, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))"
    )
    runs = [_import_in_fresh_interpreter(code) for _ in range(3)]
    assert all(r["heavy"] == [] for r in runs), runs
    assert min(r["dt"] for r in runs) < 0.5, runs


def test_public_names_resolve_lazily():
    code = (
        "import json, sys, ortlab; before = 'ortlab.probe' in sys.modules; f = ortlab.doctor; "
        "print(json.dumps({'before': before, 'after': 'ortlab.probe' in sys.modules, 'callable': callable(f), "
        "'torch': 'torch' in sys.modules}))"
    )
    r = _import_in_fresh_interpreter(code)
    assert r == {"before": False, "after": True, "callable": True, "torch": False}


def test_unknown_attribute_is_an_attribute_error():
    import ortlab

    with pytest.raises(AttributeError, match="no_such_thing"):
        ortlab.no_such_thing  # noqa: B018


# What `import ortlab.runner` may load of ortlab: every face imports it to list, follow, stop and launch runs.
RUNNER_MODULES = 40


def test_the_runner_loads_its_launchers_when_a_run_asks_for_one():
    """`import ortlab.runner` loads the run folder, the spec and the launcher interface, not the launchers: the
    foreground's trainer, the job side and Ray's client load when a run asks for them (`launcher_for`). It loaded
    90 of ortlab's modules when runner/ imported the foreground path eagerly and borrowed four tag strings from the
    job side (now `ortlab.wire`, beneath both)."""
    code = (
        "import json, sys, ortlab.runner; "
        "print(json.dumps({'ortlab': sorted(m for m in sys.modules if m.startswith('ortlab')), "
        "'torch': 'torch' in sys.modules}))"
    )
    r = _import_in_fresh_interpreter(code)
    assert len(r["ortlab"]) <= RUNNER_MODULES, f"{len(r['ortlab'])} ortlab modules: {r['ortlab']}"
    eager = [m for m in r["ortlab"] if m.startswith(("ortlab.job", "ortlab.lifecycle", "ortlab.runner.foreground"))]
    assert eager == [] and not r["torch"], r
