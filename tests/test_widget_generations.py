"""ortlab's widgets on both ipywidgets generations (issue #43): ipywidgets 8 displays a widget through
`_repr_mimebundle_`, ipywidgets 7 (Colab's 7.7.1) through `_ipython_display_` and has no `_repr_mimebundle_`.

Each test runs a real kernel whose PYTHONPATH puts the ipywidgets-7 overlay (tests/helpers/overlays.py) first, or
nothing (ortlab's environment: ipywidgets 8), and reads the outputs the kernel sent: IPython prints a failed display
as an error output and goes on, so "no exception" is not enough: the outputs must be the widget views."""

from __future__ import annotations

import nbformat
import pytest
from overlays import IPYWIDGETS_7, env_with, overlay

from ortlab.notebooks import run_notebook

ROOT_NOTEBOOKS = __import__("conftest").ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
GENERATIONS = {"7": IPYWIDGETS_7, "8": None}


def errors_in(nb) -> list[str]:
    """Every error output of an executed notebook, as `ename: evalue` (a failed display is one of these)."""
    return [
        f"{o.get('ename')}: {o.get('evalue')}"
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


def use_generation(monkeypatch, major: str) -> None:
    """Make the kernels this test starts see ipywidgets `major` (an overlay first on PYTHONPATH for 7)."""
    packages = GENERATIONS[major]
    if packages is not None:
        monkeypatch.setenv("PYTHONPATH", env_with(overlay("ipywidgets7", packages))["PYTHONPATH"])


@pytest.mark.slow
@pytest.mark.parametrize("major", sorted(GENERATIONS))
def test_each_widget_displays(major, tmp_path, monkeypatch):
    use_generation(monkeypatch, major)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("smoke = False")
    params.metadata["tags"] = ["parameters"]
    root = str(tmp_path / "runs")
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("import ipywidgets, plotly\nprint(ipywidgets.__version__, plotly.__version__)"),
        nbformat.v4.new_code_cell(f"from ortlab.ui import Workbench\nWorkbench(root={root!r})"),
        nbformat.v4.new_code_cell("from ortlab.ui import RunMonitor\nRunMonitor()"),
        nbformat.v4.new_code_cell("from ortlab.ui.livechart import LiveChart\nLiveChart()"),
        nbformat.v4.new_code_cell(f"from IPython.display import display\ndisplay(Workbench(root={root!r}))"),
    ]
    nbformat.write(nb, tmp_path / "in.ipynb")
    out = run_notebook(tmp_path / "in.ipynb", tmp_path / "out.ipynb", {"smoke": True}, cwd=tmp_path)
    executed = nbformat.read(out, as_version=4)
    assert errors_in(executed) == []
    # (cell 0 is the parameters cell, cell 1 papermill's injected one)
    version = executed.cells[2].outputs[0]["text"]
    assert version.startswith(f"{major}."), f"the kernel ran ipywidgets {version}, not {major}"
    for cell in executed.cells[3:]:
        displays = [o for o in cell.outputs if o["output_type"] in ("display_data", "execute_result")]
        assert len(displays) == 1, f"{cell.source!r}: {cell.outputs}"
        data = displays[0]["data"]
        assert data[WIDGET_VIEW]["model_id"], cell.source  # the live view a front end draws
        assert data[WIDGET_VIEW]["version_major"] == 2
        if "LiveChart" not in cell.source:  # ortlab's run views also carry the static one
            assert "ortlab" in data["text/html"], cell.source


# Notebook 01 top to bottom on ipywidgets 7.7.1 and plotly 5.24.1 runs in tests/test_colab_like.py (in a Colab-like
# host, with the same checks: no error output, a live widget shown); on ipywidgets 8 in tests/test_notebooks.py.
