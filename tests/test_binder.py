"""Binder builds with the project's own set-up; the README's badges point at real notebooks."""

from __future__ import annotations

import ast
import re

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
