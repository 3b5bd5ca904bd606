"""The house: ortlab's modules import only downwards (pyproject's import-linter contract, run by `scripts/dev lint`)
and form no import circle anywhere, inside a layer included (the contract allows `:` siblings to import each other,
so a circle between them would pass it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_between_ortlabs_modules():
    graph = grimp.build_graph("ortlab", exclude_type_checking_imports=True)
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert _circles(edges) == [], "these modules import each other in a circle: move the shared part down a layer"


def test_the_layer_contract_holds():
    """The same check as `scripts/dev lint`, so that a test run alone also catches an upward import."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert "KEPT" in out.stdout and "BROKEN" not in out.stdout


def test_every_module_is_in_a_layer():
    """A module in no layer is checked by nothing: import-linter lets it import anything (ortlab.train.control
    was such a module). Each module must be a layer's entry or inside one (a package entry holds its modules);
    the package `__init__` files that only say what the package is are exempt."""
    import re

    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = config["tool"]["importlinter"]["contracts"]
    entries = [name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)]
    missing = []
    for path in sorted((ROOT / "ortlab").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            if len(parts) == 2 or not re.sub(r'(?s)^\s*""".*?"""', "", path.read_text()).strip():
                continue  # ortlab/__init__.py, or a package's docstring alone
            parts = parts[:-1]
        module = ".".join(parts)
        if not any(module == e or module.startswith(e + ".") for e in entries):
            missing.append(module)
    assert missing == [], f"modules in no layer of pyproject.toml's import-linter contract: {missing}"


def test_each_runner_and_job_module_says_which_side_it_runs_on():
    """The driver (the user's machine: launch, follow, bring home) and the job (a cluster node) are two processes;
    a module's first docstring line says which, so nobody has to find out by reading it."""
    import ast

    for package, side in (("runner", "Driver side:"), ("job", "Job side:")):
        for path in sorted((ROOT / "ortlab" / package).glob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert doc.startswith(side), f"{path.relative_to(ROOT)}: its docstring should start with {side!r}"


def test_each_folder_is_one_layer():
    """A package is one entry of the contract, never split across layers by its modules: `train/` once held the
    trainer below `tune/` and the run's lifecycle above it (`train.run` imported `tune.auto` while `tune` imported
    `train.*`), an upward arrow between folders that the module-level contract allowed."""
    import re

    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = config["tool"]["importlinter"]["contracts"]
    entries = [name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)]
    inside = [e for e in entries if e.count(".") > 1]
    assert inside == [], f"these entries name a module inside a package: put the whole package in one layer: {inside}"


# --- modules small enough to hold in one head, and one file name per module (issue #47) ----------------------------
MAX_MODULE_LINES = 500


def _modules() -> list[Path]:
    return sorted(p for p in (ROOT / "ortlab").rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules (at most {MAX_MODULE_LINES} lines each): {long}"


def test_no_two_modules_share_a_file_name():
    """`mix.py` in two packages meant two things, and a reader (or a tracing tool) followed the wrong one.
    `__init__.py` and `__main__.py` are what Python names them."""
    seen: dict[str, list[str]] = {}
    for p in _modules():
        if p.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
