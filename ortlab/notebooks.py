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
    unknown = set(parameters or {}) - set(parameter_names(path))
    if unknown:
        raise ValueError(f"{path.name} has no parameter(s) {sorted(unknown)}; it has {parameter_names(path)}")
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
