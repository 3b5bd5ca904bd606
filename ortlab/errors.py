"""`OrtlabError`: the one base of every error ortlab raises for its user to read.

Each ortlab error also keeps the built-in base it always had (a bad spec is still a `ValueError`, an unsafe path
still an `OSError`), so code that caught those keeps working. The faces (CLI, server, workbench) catch
`OrtlabError` in one place and show its message: it is written to be read, naming what was wrong and how to fix
it. Anything else that escapes is a bug, and is shown with its traceback.
"""

from __future__ import annotations


class OrtlabError(Exception):
    """An error whose message is for the user: what was wrong, and what to do about it."""
