"""Run folders' names and where they live: the safe alphabet a name keeps to, the default name of a new run, the
folder of a run id (inside the runs root, whatever the id says), and whether a runs root can take a new run folder.

A run id comes from users, the CLI, a server's URL and a folder's own files: `run_folder` refuses any that could
name a place outside the root (`..`, an absolute path, a link), and `check_name` allows only letters, digits,
'.', '_' and '-'.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

from ortlab.errors import OrtlabError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_RULE = "1-100 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"


class OutputFolderError(OrtlabError, OSError):
    """The folder runs are created in cannot be one (a file is in the way, no permission): says which and why."""


def check_output_folder(root: str | os.PathLike) -> None:
    """Refuse an output folder that a run folder cannot be created in, before the checks that cost (the data read,
    the model's tokenizer, the embedded LLM made: 13-20 s) rather than after them: the folder, or where it would be
    created (its nearest existing parent), must be a folder this user can write in. Creates nothing: a refused
    launch leaves nothing behind. A look, not a lock: `RunDir.create` still says what goes wrong after it."""
    fix = "choose another output folder (--output-dir, or output_dir in the spec)"
    base = Path(os.path.expanduser(os.fspath(root)))
    here = base
    while not os.path.lexists(here) and here.parent != here:
        here = here.parent
    if not here.is_dir():
        what = "a file, or a file is in its path" if here.is_file() else "not a folder (a FIFO, a device, a link)"
        raise OutputFolderError(f"the output folder {base} is {what}: {fix}")
    if not os.access(here, os.W_OK | os.X_OK):
        where = "" if here == base else f" (it would be created in {here})"
        raise OutputFolderError(f"the output folder {base} cannot be written by this user{where}: {fix}")


def check_name(name: str, what: str = "run name") -> str:
    """`name` if it is a safe folder name, else ValueError saying what is allowed."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not allowed: use {NAME_RULE}")
    return name


def default_name(short: str, model: str, when: datetime | None = None) -> str:
    """Short and telling: `cls-all-minilm-l6-v2-1123-101500` (the task's short name (`ortlab.tasks.Task.short`),
    model, month-day, time)."""
    base = re.split(r"[\\/]", model.rstrip("/\\"))[-1] or "model"
    base = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._")[:28].strip("-._") or "model"
    stamp = (when or datetime.now()).strftime("%m%d-%H%M%S")
    return f"{short or 'run'}-{base}-{stamp}"


def run_folder(root: str | os.PathLike, run_id: str) -> Path:
    """The folder of run `run_id` under `root`, guaranteed inside it; ValueError for any id that could escape."""
    check_name(run_id, "run id")
    base = Path(root)
    path = base / run_id
    if path.is_symlink():
        raise ValueError(f"run id {run_id!r} is a symbolic link; ortlab only opens real run folders")
    if path.exists() and path.resolve().parent != base.resolve():
        raise ValueError(f"run id {run_id!r} resolves outside the runs folder {str(base)!r}")
    return path
