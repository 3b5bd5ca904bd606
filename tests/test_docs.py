"""The README and docs/ hold together: every relative link leads somewhere, every `ortlab ...` command quoted in the
README and the guide exists (it answers `--help`), and the README's map of the package names every module of
`ortlab/` and no other (regenerate it with `scripts/package_map.py`)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# Where commands are quoted for the reader to type.
COMMAND_DOCS = [README, ROOT / "docs" / "development.md", *sorted((ROOT / "docs" / "guide").rglob("*.md"))]
# Inline code that starts with `ortlab` but is not a command: what `jupyter server extension list` prints.
NOT_COMMANDS = {"ortlab enabled OK"}
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}

FENCE = re.compile(r"^(`{3,}|~{3,})([\w-]*).*?$\n(.*?)^\1\s*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (a link there is not a link)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes for a Markdown file."""
    seen: dict[str, int] = {}
    anchors = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return broken


def test_every_relative_link_in_the_readme_and_docs_resolves():
    assert DOCS, "docs/ has no Markdown"
    broken = [problem for path in [README, *DOCS] for problem in _broken_links(path)]
    assert not broken, "\n".join(broken)


def test_heading_anchors_follow_github():
    assert "the-embedded-default-scriptsdev-demo" in _anchors(ROOT / "docs" / "guide" / "runs-and-the-run-folder.md")
    assert "torchcompile-the-compile-runtime" in _anchors(ROOT / "docs" / "guide" / "accelerations-and-runtimes.md")


def _segments(command_line: str) -> list[list[str]]:
    """The `ortlab` invocations of one shell line: the words after `ortlab`, for each."""
    found = []
    for segment in re.split(r"\|\|?|&&|;", command_line):
        words = segment.split()
        if words and words[0] == "$":
            words = words[1:]
        if words and (words[0] == "ortlab" or words[0].endswith("/ortlab")):
            found.append(words[1:])
    return found


def quoted_commands(path: Path) -> list[list[str]]:
    """Every `ortlab ...` command a Markdown file quotes: in shell code blocks and in inline code."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in FENCE.finditer(text):
        if block.group(2).lower() not in SHELL_FENCES:
            continue
        for line in block.group(3).replace("\\\n", " ").splitlines():
            commands += _segments(re.sub(r"(^|\s)#.*$", "", line))
    for span in INLINE_CODE.finditer(FENCE.sub("", text)):
        code = " ".join(span.group(2).split())
        if code not in NOT_COMMANDS:
            commands += _segments(code)
    return commands


# Runs in one process of the venv's Python: the console script `ortlab` (the venv's entry point) once per command,
# with `--help`. Each command's words name subcommands as far as the click tree has them; a word that is no
# subcommand where one is expected is reported as unknown.
_RUN_HELP = r"""
import contextlib, io, json, runpy, sys
import typer
from ortlab.cli import app
entry, commands = sys.argv[1], json.loads(sys.stdin.read())
root = typer.main.get_command(app)
paths, unknown = {}, []
for words in commands:
    node, path = root, []
    for word in words:
        sub = getattr(node, "commands", {}).get(word)
        if sub is None:
            break
        node, path = sub, [*path, word]
    rest = words[len(path):]
    if hasattr(node, "commands") and rest and not rest[0].startswith("-"):
        unknown.append(" ".join(words))
    else:
        paths[" ".join(path)] = path
codes = {}
for key, path in sorted(paths.items()):
    sys.argv = [entry, *path, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(entry, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    codes[key] = [code, out.getvalue()[-2000:]]
print(json.dumps({"unknown": unknown, "codes": codes}))
"""


def test_every_quoted_ortlab_command_answers_help():
    entry = ROOT / ".venv" / "bin" / "ortlab"
    if not entry.is_file():
        entry = Path(sys.executable).parent / "ortlab"
    if not entry.is_file():
        pytest.skip("no `ortlab` console script in .venv/bin or beside this Python")
    commands = [words for path in COMMAND_DOCS for words in quoted_commands(path)]
    assert len(commands) > 30, commands  # the README and the guide quote many: finding few means the parser broke
    unique = sorted({json.dumps(words) for words in commands})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [str(entry.parent / "python"), "-c", _RUN_HELP, str(entry)],
        input=json.dumps([json.loads(words) for words in unique]),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not answer["unknown"], f"quoted commands that ortlab does not have: {answer['unknown']}"
    failed = {f"ortlab {key} --help".replace("  ", " "): out for key, (code, out) in answer["codes"].items() if code}
    assert not failed, failed
    # The commands the README leads with are among those checked.
    assert {"train", "doctor", "runs", "runtime create", "cluster start"} <= set(answer["codes"])


def test_commands_are_read_from_shell_blocks_and_inline_code(tmp_path):
    sample = (
        "```bash\n.venv/bin/ortlab trian spec.yaml   # a typo, ortlab train\nortlab runs | ortlab follow RUN\n```\n"
        "```python\nortlab.launch()  # ortlab train\n```\n`ortlab stop RUN`, `ortlab.attach(x)`, `pip install ortlab`"
    )
    path = tmp_path / "sample.md"
    path.write_text(sample)
    assert quoted_commands(path) == [["trian", "spec.yaml"], ["runs"], ["follow", "RUN"], ["stop", "RUN"]]


def _package_map():
    spec = importlib.util.spec_from_file_location("package_map", ROOT / "scripts" / "package_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_maps_every_module_of_the_package():
    package_map = _package_map()
    mapped = package_map.mapped(README.read_text(encoding="utf-8"))
    modules = {path.relative_to(ROOT).as_posix() for path in package_map.modules()}
    missing, gone = sorted(modules - mapped), sorted(mapped - modules)
    fix = "run `.venv/bin/python scripts/package_map.py` to write the README's map again"
    assert not missing, f"modules missing from the README's map: {missing}; {fix}"
    assert not gone, f"the README's map names modules that no longer exist: {gone}; {fix}"
    assert len(modules) > 50


def test_the_package_map_reads_modules_and_packages_back():
    package_map = _package_map()
    assert package_map.mapped(package_map.render()) == {
        path.relative_to(ROOT).as_posix() for path in package_map.modules()
    }
    assert package_map.shorten("a" * 10) == "a" * 10
    long = "Word, " * 40
    assert len(package_map.shorten(long)) <= package_map.LIMIT + 2
    assert package_map.shorten("x " * 50 + "`a b c d e f g h i j k l m n o p q r s t u v w x y z`").count("`") % 2 == 0
