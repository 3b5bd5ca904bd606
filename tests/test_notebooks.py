"""Every tutorial notebook runs top to bottom through papermill in smoke mode; a failing cell fails the test.

The executed notebooks are kept in test-artifacts/notebooks/ (with their outputs) for inspection.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from ortlab.notebooks import NotebookFailed, parameter_names, run_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"


def test_there_are_tutorials():
    assert [p.name for p in NOTEBOOKS] == [
        "01-quickstart.ipynb",
        "02-acceleration-tour.ipynb",
        "03-export-and-push.ipynb",
        "04-bring-your-own-data.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_clean_and_parameterized(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), (
        "notebooks are committed without outputs"
    )
    assert "smoke" in parameter_names(path)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 2, "each notebook explains what and why in prose"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = run_notebook(
        path, ARTIFACTS / path.name, {"smoke": True, "runs_folder": str(tmp_path / "runs")}, cwd=tmp_path
    )
    executed = nbformat.read(out, as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []


def test_a_failing_cell_fails_the_run(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("smoke = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("assert not smoke, 'smoke mode reached the failing cell'")]
    nbformat.write(nb, tmp_path / "fails.ipynb")
    with pytest.raises(NotebookFailed, match="AssertionError: smoke mode reached the failing cell"):
        run_notebook(tmp_path / "fails.ipynb", tmp_path / "out.ipynb", {"smoke": True})
    with pytest.raises(ValueError, match="no parameter"):
        run_notebook(tmp_path / "fails.ipynb", tmp_path / "out.ipynb", {"smokey": True})
    assert Path(tmp_path / "out.ipynb").exists()
