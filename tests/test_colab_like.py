"""Installing ortlab into a notebook host leaves the host's kernel as it was, and the tutorials run there (#43).

The host is a Colab-like Python 3.12 venv (tests/helpers/colablike.py, from requirements/colab-like.txt: Colab's
kernel pins, ipywidgets 7.7.1, plotly 5.24.1, classic notebook 6.5, torch 2.9 and transformers 4.57), in two
generations of the notebook views: as Colab has them, and with ipywidgets 8 and plotly 6 on top
(requirements/colab-like-widgets8.txt). Notebooks 01 to 05 are executed by papermill, one after the other, on a kernel
of that venv, with ortlab not installed at first: 01's own first cell installs it (pointed at this checkout by
ORTLAB_PIP_SOURCE), as on Colab, and 03's and 05's add the extras they need; each runs in smoke mode. Then the
kernel's packages (ipykernel, IPython, jupyter-client, tornado, pyzmq, traitlets, prompt-toolkit, ...) are compared
with before. (06 starts a local Ray cluster and 07 repeats 05's model: both run in ortlab's own environment,
tests/test_notebooks.py.)

The venv is built once (about 90 s and 7 GB here, most of it torch's CUDA wheels) and cached outside the clone; each
run works on a hard-linked copy of it. Times go to test-artifacts/colab-like/HOST/times.json, the executed notebooks
beside them."""

from __future__ import annotations

import json
import subprocess
import time

import nbformat
import pytest
from colablike import KERNEL_PACKAGES, _uv, bare_env, colab_like_venv, copy_of, versions
from conftest import ROOT
from test_notebooks import warnings_shown

from ortlab.notebooks import run_notebook

ARTIFACTS = ROOT / "test-artifacts" / "colab-like"
# The host's generation of the notebook views: None keeps Colab's (ipywidgets 7.7.1, plotly 5.24.1); a file lists the
# versions installed on top of them before ortlab.
HOSTS = {"ipywidgets7-plotly5": None, "ipywidgets8-plotly6": ROOT / "requirements" / "colab-like-widgets8.txt"}
NOTEBOOKS = [
    "01-quickstart", "02-acceleration-tour", "03-export-and-push", "04-bring-your-own-data", "05-small-llm-lora",
]  # fmt: skip
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


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
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_tutorials_install_and_run_in_a_colab_like_host(host, tmp_path, monkeypatch):
    times = {}
    start = time.monotonic()
    base, built_s = colab_like_venv()
    times["venv_build_s"] = round(built_s, 1)  # 0 when it was cached
    venv = copy_of(base, tmp_path / "venv")
    python = venv / "bin" / "python"
    if HOSTS[host] is not None:  # the newer views, as the host's user would have them before meeting ortlab
        cmd = [_uv(), "pip", "install", "-q", "--python", str(python), "-r", str(HOSTS[host])]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=bare_env())
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr[-3000:]}"
    before = versions(python)
    widgets_major = "8" if HOSTS[host] else "7"
    assert before["ipykernel"] == "6.17.1" and before["ipywidgets"].startswith(f"{widgets_major}."), before
    assert versions(python, ("ortlab",)) == {"ortlab": None}, "the host must not have ortlab before its install cell"

    kernel_spec(python, tmp_path / "jupyter")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("ORTLAB_PIP_SOURCE", ROOT.resolve().as_uri())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    # A fresh host's ortlab cache (the doctor's, the peak's): what this machine's other environments cached is not
    # the host's (its doctor once reported the development venv's compile runtime as "built for another ortlab").
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "ortlab-cache"))
    times["ready_s"] = round(time.monotonic() - start, 1)
    shown = {}
    for name in NOTEBOOKS:
        began = time.monotonic()
        out = run_notebook(
            ROOT / "notebooks" / f"{name}.ipynb",
            ARTIFACTS / host / f"{name}.ipynb",
            {"smoke": True, "runs_folder": str(tmp_path / "runs" / name)},
            cwd=tmp_path,
            kernel_name="colab-like",
        )
        times[f"{name}_s"] = round(time.monotonic() - began, 1)
        executed = nbformat.read(out, as_version=4)
        outputs = [o for c in executed.cells for o in c.get("outputs", [])]
        errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
        assert errors == [], f"{name}: a cell failed (IPython 7 prints a failed display and goes on)"
        said = "".join(o.get("text", "") for o in executed.cells[1].get("outputs", []))
        assert "pip changed packages" not in said, f"{name}: {said}"
        if name == NOTEBOOKS[0]:  # no anywidget in the host: the open page must be told to load it
            assert "with anywidget" in said and "Reload this page once" in said, f"{name}: {said!r}"
        assert warnings_shown(executed) == [], f"{name}: library warnings reached the notebook's output"
        shown[name] = [o["data"][WIDGET_VIEW] for o in outputs if WIDGET_VIEW in o.get("data", {})]

    after = versions(python)
    changed = {name: (before[name], after[name]) for name in KERNEL_PACKAGES if before[name] != after[name]}
    assert changed == {}, f"installing ortlab changed the kernel's packages: {changed}"
    installed = versions(python, ("ortlab", "transformers", "peft", "onnxruntime"))
    assert all(installed.values()), f"the install cells did not install ortlab and its extras: {installed}"
    assert installed["transformers"].startswith("5."), installed  # Colab's 4.57 is below ortlab's floor
    assert shown["01-quickstart"] and all(v["model_id"] for v in shown["01-quickstart"]), (
        f"the quickstart displayed no live widget on ipywidgets {widgets_major}"
    )
    times["total_s"] = round(time.monotonic() - start, 1)
    (ARTIFACTS / host).mkdir(parents=True, exist_ok=True)
    record = {**times, "kernel": before, "after": installed, "widget_views": {k: len(v) for k, v in shown.items()}}
    (ARTIFACTS / host / "times.json").write_text(json.dumps(record, indent=1))
