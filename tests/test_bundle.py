"""The offline wheelhouse: built for real, installed into a fresh environment that already has torch and
transformers, with the package index switched off; ortlab runs there and keeps that environment's torch.

The "existing environment" is a fresh venv with a CPU torch >= 2.7 and transformers from the lock (the local torch
wheel that ortlab's compile runtime uses, so no GB-sized CUDA download): the stand-in for a GPU node's own torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab import runtimes
from ortlab.bundle import PROVIDED, BundleError, _beyond, bundle

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_bad_arguments_fail_before_any_work(tmp_path):
    with pytest.raises(BundleError, match="give a CPython minor version"):
        bundle(tmp_path / "wh", "3.12; rm -rf /")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="is a file"):
        bundle(tmp_path / "file", HERE)
    assert not (tmp_path / "wh").exists()


def test_what_the_environment_pulls_in_stays_out():
    compiled = "\n".join(
        [
            "torch==2.13.0  # via -r r.in",
            "sympy==1.14.0  # via torch",
            "mpmath==1.3.0  # via sympy",
            "transformers==5.23.0  # via -r r.in, ortlab",
            "plotly==7.1.0  # via ortlab",
            "narwhals==2.29.0  # via plotly",
            "packaging==26.3  # via plotly, transformers",
            "typer==0.29.2  # via transformers",
            "pydantic==2.14.3  # via ortlab, typer",
            "tokenizers==0.23.3  # via transformers",
            "ortlab @ file:///x.whl  # via -r r.in",
        ]
    )
    # pydantic and packaging go in although transformers' side needs them too: a GPU image's own transformers
    # came without pydantic (the wheelhouse's first install on an H200 failed for want of it)
    expected = ["plotly==7.1.0", "narwhals==2.29.0", "packaging==26.3", "pydantic==2.14.3"]
    assert _beyond(compiled, ("torch", "transformers")) == expected


@pytest.fixture(scope="module")
def existing_env(tmp_path_factory) -> Path:
    """A fresh venv with torch >= 2.7 (CPU) and transformers, numpy, pandas, pyarrow at the lock's versions."""
    links = runtimes._find_links()
    torch_req, source = runtimes._torch_requirement(links)
    if "index" in source:
        pytest.skip(f"no local CPU torch >= 2.7 wheel for Python {HERE}: the test would download {source}")
    uv = runtimes._uv()
    if uv is None:
        pytest.skip("uv is not installed: the dev environment (requirements/dev.lock) has it")
    venv = tmp_path_factory.mktemp("existing-env") / "venv"
    subprocess.run([uv, "venv", "--quiet", "--seed", "--python", runtimes._base_python(), str(venv)], check=True)
    python = venv / "bin" / "python"
    cons = venv.parent / "constraints.txt"
    cons.write_text("\n".join(c for c in runtimes._constraints() if not c.lower().startswith("torch=")) + "\n")
    flags = [x for f in links for x in ("--find-links", f)]
    cmd = [uv, "pip", "install", "--quiet", "--python", str(python), *flags, "-c", str(cons), torch_req]
    subprocess.run([*cmd, *(p for p in PROVIDED if p != "torch")], check=True)
    return python


@pytest.mark.slow
def test_offline_install_into_an_environment_with_torch_keeps_it(existing_env, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    cli = [sys.executable, "-m", "ortlab.cli", "bundle", "--out", str(wheelhouse), "--python", HERE]
    built = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    manifest = json.loads((wheelhouse / "manifest.json").read_text())
    names = {f["file"].split("-")[0].lower() for f in manifest["files"]}
    assert "ortlab" in names and {"plotly", "ipywidgets", "anywidget"} <= names
    assert not names & {"torch", "transformers", "numpy", "pandas", "pyarrow", "tokenizers", "sympy"}, names
    assert manifest["total_mb"] < 60 and manifest["python"] == HERE
    for f in manifest["files"]:
        assert (wheelhouse / f["file"]).stat().st_size == f["bytes"]

    def torch_version() -> str:
        code = "import torch; print(torch.__version__)"
        return subprocess.run([existing_env, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    before = torch_version()
    # Offline: no index, and none of pip's configured find-links or extra indexes either.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH", "ORTLAB_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", ORTLAB_CACHE_DIR=str(tmp_path / "cache"))
    env["ORTLAB_RUNTIMES_DIR"] = str(tmp_path / "runtimes")
    install = [existing_env, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse, "ortlab[ui]"]
    out = subprocess.run(install, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert torch_version() == before, "installing ortlab kept the environment's torch"
    doctor = subprocess.run(
        [existing_env.parent / "ortlab", "doctor", "--json"], capture_output=True, text=True, env=env, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    report = json.loads(doctor.stdout)
    assert report["torch"] == before and report["executable"].startswith(str(existing_env.parent.parent))
    assert report["accelerations"]["ort"]["available"] is False, "no ORT next to a current torch"
    assert report["gpu"]["available"] is False and report["gpu_findings"][0]["name"] == "cuda"
