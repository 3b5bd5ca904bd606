"""Running ortlab's notebooks with parameters (papermill), as CI does and as `ortlab notebook` does.

Each tutorial notebook has a cell tagged `parameters` (model, data, a `smoke` switch, ...). papermill injects
the values given here after it and executes every cell; a failing cell fails the whole run with the cell's
error, and the executed notebook (with its outputs) is written next to the others for inspection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError


class NotebookFailed(OrtlabError, RuntimeError):
    """A cell raised; the message names the notebook, the cell and the error."""


class NotebookUnusable(OrtlabError, ValueError):
    """The notebook cannot be run as asked: it cannot be read as a notebook, or it lacks a parameter given."""


def parameter_names(path: str | Path) -> list[str]:
    """The names assigned in the notebook's `parameters` cell (what `-p` may set)."""
    import ast

    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            tree = ast.parse(cell.source)
            return [
                t.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            ]
    return []


def run_notebook(
    path: str | Path,
    output: str | Path,
    parameters: dict[str, Any] | None = None,
    cwd: str | Path | None = None,
    kernel_name: str = "python3",
    timeout_s: int = 1800,
) -> Path:
    """Execute `path` with `parameters` into `output`; raises NotebookFailed when a cell fails."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path, output = Path(path), Path(output)
    try:
        names = parameter_names(path)
    except (OSError, ValueError) as e:  # missing, unreadable, not JSON (nbformat's NotJSONError is a ValueError)
        raise NotebookUnusable(f"{path}: cannot be read as a notebook: {e}") from None
    unknown = set(parameters or {}) - set(names)
    if unknown:
        raise NotebookUnusable(f"{path.name} has no parameter(s) {sorted(unknown)}; it has {names}")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        papermill.execute_notebook(
            str(path),
            str(output),
            parameters=parameters or {},
            kernel_name=kernel_name,
            progress_bar=False,
            cwd=str(cwd or path.parent),
            execution_timeout=timeout_s,
        )
    except PapermillExecutionError as e:
        raise NotebookFailed(
            f"{path.name}: cell {e.exec_count} failed with {e.ename}: {e.evalue} (executed notebook: {output})"
        ) from None
    return output
