"""Count the task branches outside ortlab/tasks/ (issue #44 item 1): each comparison of a task or feature name with
a string constant (`spec.task == "seq2seq"`, `task in ("causal-lm", ...)`, `feature != "causal-lm"`), and each
literal table keyed by task names (`{"seq2seq": ...}`), in ortlab/'s Python files. Run from the repository root:

    python scripts/task_branches.py [-v]

It reads the code (ast), so a string in a docstring or a comment does not count; -v lists each branch.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

NAMES = {"sequence-classification", "token-classification", "causal-lm", "seq2seq", "seq2seq-lm", "masked-lm"}
NAMES |= {"question-answering", "preference"}


def _named(node: ast.AST) -> bool:
    """An expression that holds a task: a name or attribute called task/feature (`spec.task`, `p["task"]`,
    `self.task.value`, `getattr(x, "feature", None)`)."""
    text = ast.unparse(node).lower()
    return "task" in text or "feature" in text


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def branches(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named(s) for s in sides) and any(_strings(s) & NAMES for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & NAMES) >= 2:
                found.append((node.lineno, "table keyed by " + ", ".join(sorted(keys & NAMES))))
    return found


def main() -> None:
    verbose = "-v" in sys.argv
    per_file: Counter[str] = Counter()
    for path in sorted(Path("ortlab").rglob("*.py")):
        if path.parts[:2] == ("ortlab", "tasks"):
            continue
        for line, text in branches(ast.parse(path.read_text(encoding="utf-8"))):
            per_file[str(path)] += 1
            if verbose:
                print(f"{path}:{line}: {text}")
    for path, n in per_file.most_common():
        print(f"{n:4d}  {path}")
    print(f"{sum(per_file.values()):4d}  in {len(per_file)} files (outside ortlab/tasks/)")


if __name__ == "__main__":
    main()
