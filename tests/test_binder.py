"""Binder builds with the project's own set-up; the README's badges point at real notebooks."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT


def _scripts_dev_apt() -> set[str]:
    tree = ast.parse((ROOT / "scripts" / "dev").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "APT":
                return set(ast.literal_eval(node.value).values())
    raise AssertionError("scripts/dev has no APT table")


def test_binder_uses_the_project_setup_on_python_3_11():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "scripts/dev setup" in post
    assert "ipykernel install --user --name python3" in post
    # Binder builds as a non-root user: apt.txt must bring every Debian package the set-up would install.
    binder_apt = set((ROOT / "binder" / "apt.txt").read_text().split())
    assert _scripts_dev_apt() - {"git"} <= binder_apt  # git is in every Binder image


def test_binder_serves_jupyter_from_the_venv_so_the_sidebar_shows():
    """The sidebar's REST API imports ortlab: Binder's Jupyter server must be the venv's, not the image's."""
    start = ROOT / "binder" / "start"
    assert start.stat().st_mode & 0o111, "binder/start must be executable"
    text = start.read_text()
    assert '.venv/bin:$PATH"' in text
    assert text.rstrip().endswith('exec "$@"')
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "jupyterhub==$JUPYTERHUB_VERSION" in post  # the single-user entry point BinderHub starts, in the venv
    # The prebuilt sidebar is committed, so Binder (no node) installs it with the package.
    assert (ROOT / "ortlab" / "labextension" / "package.json").is_file()


def test_readme_badges_point_at_notebooks_that_exist():
    readme = (ROOT / "README.md").read_text()
    binder = re.findall(r"mybinder\.org/v2/gh/[^)\s]+urlpath=lab/tree/(notebooks/[\w.-]+\.ipynb)", readme)
    colab = re.findall(r"colab\.research\.google\.com/github/[^)\s]+/blob/main/(notebooks/[\w.-]+\.ipynb)", readme)
    assert binder
    assert colab
    for path in binder + colab:
        assert (ROOT / path).exists(), path


@pytest.mark.slow
def test_postbuild_runs_as_repo2docker_runs_it_and_its_kernel_imports_ortlab(tmp_path):
    """repo2docker runs `binder/postBuild` from the repository's root with bash, in the user's home, after apt.txt;
    then `binder/start` wraps the server's command. Both run here (as far as this machine allows: as root, in the
    existing venv, whose set-up is idempotent), with a home of their own so the developer's kernels and profile stay
    as they are; the caches are the machine's (a second set-up takes seconds)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    built = subprocess.run(["bash", "binder/postBuild"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "ortlab-sidebar" in built.stdout, "postBuild checks that the sidebar is installed"
    assert "export TOKENIZERS_PARALLELISM=false" in (home / ".profile").read_text()

    # binder/start puts the venv first: the server BinderHub starts and the notebooks' kernel are the venv's.
    listed = subprocess.run(
        ["binder/start", "jupyter", "kernelspec", "list", "--json"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    # Which "python3" wins (the venv's own, or the one postBuild installed) is jupyter_core's choice (it prefers the
    # environment's); both must start the venv's Python with ortlab and the widgets in it.
    python = json.loads(listed.stdout)["kernelspecs"]["python3"]["spec"]["argv"][0]
    which = subprocess.run(["binder/start", "which", "jupyter"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert Path(which.stdout.strip()) == ROOT / ".venv" / "bin" / "jupyter"
    probe = "import sys, ortlab, ipywidgets, plotly; print(sys.prefix)"
    imported = subprocess.run(
        ["binder/start", python, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()) == ROOT / ".venv"
