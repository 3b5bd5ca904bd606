"""Installing ortlab into a notebook host leaves the host's kernel as it was, and the tutorial runs there (#43).

The host is a Colab-like Python 3.12 venv (tests/helpers/colablike.py, from requirements/colab-like.txt: Colab's
kernel pins, ipywidgets 7.7.1, plotly 5.24.1, classic notebook 6.5, torch 2.9 and transformers 4.57). Notebook 01 is
executed by papermill on a kernel of that venv, with ortlab not installed: its own first cell installs it (pointed at
this checkout by ORTLAB_PIP_SOURCE), as on Colab, and the rest runs in smoke mode. Then the kernel's packages
(ipykernel, IPython, jupyter-client, tornado, pyzmq, traitlets, prompt-toolkit, ...) are compared with before.

The venv is built once (about 90 s and 7 GB here, most of it torch's CUDA wheels) and cached outside the clone; each
run works on a hard-linked copy of it. Times go to test-artifacts/colab-like/times.json."""

from __future__ import annotations

import json
import time

import nbformat
import pytest
from colablike import KERNEL_PACKAGES, colab_like_venv, copy_of, versions
from conftest import ROOT

from ortlab.notebooks import run_notebook

ARTIFACTS = ROOT / "test-artifacts" / "colab-like"


def kernel_spec(python, folder):
    """A kernelspec named `colab-like` in `folder/kernels` that starts `python`'s ipykernel (PYTHONPATH emptied:
    the kernel must import ortlab from its own venv, after the install cell put it there)."""
    spec = folder / "kernels" / "colab-like"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Colab-like (Python 3.12)",
                "language": "python",
                "env": {"PYTHONPATH": ""},
            }
        )
    )


@pytest.mark.slow
def test_the_quickstart_installs_and_runs_in_a_colab_like_host(tmp_path, monkeypatch):
    times = {}
    start = time.monotonic()
    base, built_s = colab_like_venv()
    times["venv_build_s"] = round(built_s, 1)  # 0 when it was cached
    venv = copy_of(base, tmp_path / "venv")
    python = venv / "bin" / "python"
    before = versions(python)
    assert before["ipykernel"] == "6.17.1" and before["ipywidgets"] == "7.7.1", before
    assert versions(python, ("ortlab",)) == {"ortlab": None}, "the host must not have ortlab before its install cell"

    kernel_spec(python, tmp_path / "jupyter")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("ORTLAB_PIP_SOURCE", ROOT.resolve().as_uri())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    ready = time.monotonic()
    times["ready_s"] = round(ready - start, 1)
    out = run_notebook(
        ROOT / "notebooks" / "01-quickstart.ipynb",
        ARTIFACTS / "01-quickstart.ipynb",
        {"smoke": True, "runs_folder": str(tmp_path / "runs")},
        cwd=tmp_path,
        kernel_name="colab-like",
    )
    times["install_and_notebook_s"] = round(time.monotonic() - ready, 1)
    executed = nbformat.read(out, as_version=4)
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for c in executed.cells for o in c.get("outputs", [])
              if o.get("output_type") == "error"]  # fmt: skip
    assert errors == [], "a cell failed (IPython 7 prints a failed display and goes on)"
    said = "".join(o.get("text", "") for o in executed.cells[1].get("outputs", []))
    assert "pip changed packages" not in said, said

    after = versions(python)
    changed = {name: (before[name], after[name]) for name in KERNEL_PACKAGES if before[name] != after[name]}
    assert changed == {}, f"installing ortlab changed the kernel's packages: {changed}"
    installed = versions(python, ("ortlab", "transformers"))
    assert installed["ortlab"], "the install cell did not install ortlab into the host"
    assert installed["transformers"].startswith("5."), installed  # Colab's 4.57 is below ortlab's floor
    views = [o for c in executed.cells for o in c.get("outputs", []) if "application/vnd.jupyter.widget-view+json"
             in o.get("data", {})]  # fmt: skip
    assert views, "the quickstart displayed no widget on ipywidgets 7"
    times["total_s"] = round(time.monotonic() - start, 1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "times.json").write_text(json.dumps({**times, "kernel": before, "after": installed}, indent=1))
