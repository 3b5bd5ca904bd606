"""Count the hand-written acceleration lists in ortlab/ (issue #47 item 1): the smallest literal (dict, tuple, list,
set) or call that names MIN (default 4) or more accelerations or their spec fields, as string constants, keyword
names or attribute names, outside ortlab/toggles.py (the one list). Run from the repository root:

    python scripts/toggle_lists.py [MIN]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WORDS = {"ort", "use_ort", "fused_adam", "zero1", "zero_stage", "precision", "fp16", "bf16", "tf32", "torch_compile"}
WORDS |= {"tcmalloc"}  # (the toggles' names and fields, and the TrainingArguments names of two)
ONE = {"use_ort": "ort", "zero_stage": "zero1", "fp16": "precision", "bf16": "precision"}  # one acceleration, one word
MODULES = {"precision", "ort", "zero", "fused_adam", "tcmalloc", "torch_compile"}  # `ort.availability` names no list


def names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and n.value in WORDS:
            out.add(n.value)
        elif isinstance(n, ast.keyword) and n.arg in WORDS:
            out.add(n.arg)
        elif (
            isinstance(n, ast.Attribute)
            and n.attr in WORDS
            and not (isinstance(n.value, ast.Name) and n.value.id in MODULES)
        ):
            out.add(n.attr)
    return {ONE.get(w, w) for w in out}


def lists(root: Path, least: int) -> list[str]:
    hits = []
    for path in sorted((root / "ortlab").rglob("*.py")):
        if path.name == "toggles.py":
            continue
        kinds = (ast.Dict, ast.Tuple, ast.List, ast.Set, ast.Call)
        found = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, kinds) and len(names(n)) >= least]
        for n in found:
            if not any(m is not n and any(c is m for c in ast.walk(n)) for m in found):  # the smallest only
                hits.append(f"{path.relative_to(root)}:{n.lineno} {sorted(names(n))}")
    return hits


if __name__ == "__main__":
    hits = lists(Path.cwd(), int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    print("\n".join(hits))
    print(f"{len(hits)} hand-written acceleration lists")
