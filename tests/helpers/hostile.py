"""Hostile inputs through the CLI, with every model load refused: what the reliability tables are built from.

`refuse_model_loads` makes any weight load (and the embedded LLM's conversion) fail the test, so a case that is
refused only after a model loaded cannot pass. `cli` runs `ortlab ARGS` in this process with real file
descriptors. `refused` runs one case and says what went wrong with it, if anything: exit code 2, the expected
words, no traceback, no run folder, nothing written outside the runs folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def spec_with(base: dict, **fields: Any) -> dict:
    """A copy of the spec `base` with `fields` set, `hyper__batch_size=0` meaning spec["hyper"]["batch_size"]."""
    spec = json.loads(json.dumps(base))
    for dotted, value in fields.items():
        node = spec
        *path, last = dotted.split("__")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return spec


def refuse_model_loads(monkeypatch: Any) -> None:
    """Weights never load and the embedded LLM is not converted from GGUF: a case that reaches them fails. (A
    tokenizer and a config may be read: they are how the model is checked against the data.)"""
    from transformers import PreTrainedModel

    import ortlab.assets
    import ortlab.lifecycle.assemble  # (it binds ortlab.tasks.load_model by name)
    import ortlab.tasks

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded for a hostile input")

    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the embedded LLM was converted for a hostile input")

    monkeypatch.setattr(ortlab.tasks, "load_model", no_model)
    monkeypatch.setattr(ortlab.lifecycle.assemble, "load_model", no_model)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", no_model)
    monkeypatch.setattr(ortlab.assets, "_llm_folder", no_conversion)


def cli(args: list[str], capfd: Any) -> tuple[int, str, BaseException | None]:
    """`ortlab ARGS` in this process, with real file descriptors (the CLI redirects them while it trains)."""
    from ortlab.cli import app

    error = None
    try:
        app(args, prog_name="ortlab")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        code, error = 1, e
    out, err = capfd.readouterr()
    return code, out + err, error


def _files_outside(root: Path, case: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(case)}


def refused(args: list[str], runs: Path, word: str, root: Path, case: Path, capfd: Any) -> tuple[str, list[str]]:
    """Run `ortlab ARGS` for one hostile case (its files under `case`, its run folder asked for at `runs`, all
    under `root`). Returns (the message shown, one-line message; the problems, empty when it was refused cleanly)."""
    before = _files_outside(root, case)
    code, output, error = cli(args, capfd)
    after = _files_outside(root, case)
    message = " ".join(output.split())
    problems = []
    if code != 2:
        problems.append(f"exit code {code} ({error!r})")
    if word.lower() not in message.lower():
        problems.append(f"message lacks {word!r}")
    if "Traceback" in output:
        problems.append("traceback shown")
    if after - before:
        problems.append(f"wrote outside the runs folder: {sorted(map(str, after - before))[:3]}")
    if runs.is_dir() and any(runs.iterdir()):
        problems.append("a run folder was created")
    return message, problems
