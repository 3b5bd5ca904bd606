"""The README and docs/ hold together, and hold to the tree: every relative link leads somewhere, every `ortlab ...`
command quoted in the README and the guide exists (it answers `--help`), the maps of the package name every module
of `ortlab/` and no other (regenerate them with `scripts/package_map.py`), development.md's layers are
pyproject.toml's, and every module the docs name exists or says where it went ("(now: ...)", "(removed: ...)")."""

from __future__ import annotations

import ast
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


def test_the_module_map_names_every_module_of_the_package():
    package_map = _package_map()
    mapped = package_map.mapped(package_map.MODULES_DOC.read_text(encoding="utf-8"))
    modules = {path.relative_to(ROOT).as_posix() for path in package_map.modules()}
    missing, gone = sorted(modules - mapped), sorted(mapped - modules)
    fix = "run `.venv/bin/python scripts/package_map.py` to write the maps again"
    assert not missing, f"modules missing from docs/guide/modules.md: {missing}; {fix}"
    assert not gone, f"docs/guide/modules.md names modules that no longer exist: {gone}; {fix}"
    assert len(modules) > 50


def test_the_readme_maps_every_package_and_links_the_module_map():
    package_map = _package_map()
    text = README.read_text(encoding="utf-8")
    mapped = package_map.mapped(text)
    packages = {path.relative_to(ROOT).as_posix() for path in package_map.packages()}
    fix = "run `.venv/bin/python scripts/package_map.py` to write the maps again"
    assert mapped == packages, f"the README's map: {sorted(mapped ^ packages)} differ from ortlab/'s packages; {fix}"
    assert len(packages) > 10
    block = text.split(package_map.START, 1)[1].split(package_map.END, 1)[0]
    assert "(docs/guide/modules.md)" in block


def test_the_package_map_reads_modules_and_packages_back():
    package_map = _package_map()
    assert package_map.mapped(package_map.render()) == {
        path.relative_to(ROOT).as_posix() for path in package_map.modules()
    }
    assert package_map.mapped(package_map.render_packages()) == {
        path.relative_to(ROOT).as_posix() for path in package_map.packages()
    }
    assert package_map.shorten("a" * 10) == "a" * 10
    long = "Word, " * 40
    assert len(package_map.shorten(long)) <= package_map.LIMIT + 2
    assert package_map.shorten("x " * 50 + "`a b c d e f g h i j k l m n o p q r s t u v w x y z`").count("`") % 2 == 0


def test_the_readme_keeps_its_two_commands_and_stays_short():
    """The README leads with the two commands (CI runs the second, `.ci/run`) and stays a front page."""
    text = README.read_text(encoding="utf-8")
    shell = [block.group(3) for block in FENCE.finditer(text) if block.group(2).lower() in SHELL_FENCES]
    commands = {line.split("#")[0].strip() for block in shell for line in block.splitlines()}
    assert {"scripts/dev demo", "scripts/dev test"} <= commands, commands
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert "scripts/dev test" in ci
    lines = len(text.splitlines())
    assert lines <= 150, f"README.md has {lines} lines: move what a first reader does not need into docs/guide/"


# --- development.md's layers are pyproject.toml's ---------------------------------------------------------------


def _contract_layers() -> list[list[str]]:
    """pyproject.toml's layers, top first, each its module names as written (`a | b` or `a : b`)."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [layer.split() for layer in contract["layers"]]


def layer_disagreements(doc: str, contract: list[list[str]]) -> list[str]:
    """Where a document's generated layer list differs from the contract: the list is read back from its lines
    (`N. `ortlab/x/` | `ortlab/y.py` — why`), each layer's modules and separators in order."""
    package_map = _package_map()
    if package_map.LAYERS_START not in doc or package_map.LAYERS_END not in doc:
        return ["no generated layer list (its markers are missing)"]
    block = doc.split(package_map.LAYERS_START, 1)[1].split(package_map.LAYERS_END, 1)[0]
    written = []
    for entry in re.findall(r"^\d+\. (.+?) — ", block, re.MULTILINE):
        words = [re.sub(r"^`ortlab/(.*?)(\.py|/)`$", r"ortlab/\1", word) for word in entry.split()]
        written.append([word.replace("/", ".") for word in words])
    problems = []
    for number in range(max(len(written), len(contract))):
        doc_layer = written[number] if number < len(written) else None
        toml_layer = contract[number] if number < len(contract) else None
        if doc_layer != toml_layer:
            problems.append(f"layer {number + 1}: the docs say {doc_layer}, pyproject.toml says {toml_layer}")
    return problems


def test_development_md_lists_the_layers_of_the_contract():
    doc = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    problems = layer_disagreements(doc, _contract_layers())
    fix = "run `.venv/bin/python scripts/package_map.py` to write development.md's layers from pyproject.toml"
    assert not problems, "\n".join([*problems, fix])


def test_layer_disagreements_finds_a_swap_and_a_missing_module():
    contract = _contract_layers()
    doc = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    runner, job = "1. `ortlab/runner/` —", "2. `ortlab/job/` —"
    block = _package_map().render_layers()
    assert runner.replace("1.", "2.") in block and job.replace("2.", "3.") in block, block
    swapped = doc.replace("`ortlab/runner/` —", "`ortlab/SWAP/` —").replace("`ortlab/job/` —", "`ortlab/runner/` —")
    swapped = swapped.replace("`ortlab/SWAP/` —", "`ortlab/job/` —")
    assert len(layer_disagreements(swapped, contract)) == 2
    assert layer_disagreements(doc.replace(" | `ortlab/ui/`", ""), contract)
    assert layer_disagreements("no list here", contract)


# --- every module the docs name exists, or says where it went ----------------------------------------------------

# `.py` file names in the docs that are not ortlab's: other projects' modules, files a user writes, hostile names,
# and a name considered and not taken (house.md: "`auto.py`, not `decide.py`").
NOT_OURS = {"typer.py", "yaml.py", "torch.py", "setup.py", "script.py", "jupyter_server_config.py", "decide.py"}
# A path to a `.py` file (with folders, or bare), an `ortlab/` folder, and a dotted name under `ortlab`.
PY_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*)([\w-]+\.py)\b")
ORTLAB_FOLDER = re.compile(r"(?<![\w/.-])(ortlab/(?:[\w-]+/)+)(?![\w.-])")
DOTTED = re.compile(r"(?<![\w/.-])ortlab(?:\.\w+)+")
# Where a stale name says where it went: "(now: `ortlab.x.y`)" or "(removed: what replaced it)" after it, or
# "`new/` (was old.py, ...)" before it.
POINTER = re.compile(r"\((?:now|removed):")
WAS = re.compile(r"\bwas `?$")
# A line that starts a paragraph of its own: a list item or a heading (a heading ends with its line).
PARAGRAPH_START = re.compile(r"[ \t]*(?:[-*+]|\d+\.)[ \t]|#")
SKIP_FOLDERS = {"node_modules", "__pycache__", "lib", "build", "dist"}


def _python_file_names() -> set[str]:
    """The name of every `.py` file of the repository (outside hidden and built folders)."""
    names = set()
    for _folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in SKIP_FOLDERS]
        names.update(name for name in files if name.endswith(".py"))
    return names


def _defined_names(module: Path) -> set[str]:
    """The names a module defines at its top (functions, classes, assignments, imports, `__all__`), read, not run."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            body += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return names


def dotted_exists(name: str, root: Path = ROOT) -> bool:
    """`ortlab.x.y` names a module, or a name a module defines (`ortlab.runner.launch`); what follows that is an
    attribute of it and not looked up."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:cut])
        module = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[cut:]
            return not rest or rest[0].startswith("__") or rest[0] in _defined_names(module)
    return False


def path_exists(folders: str, name: str, root: Path, file_names: set[str]) -> bool | None:
    """Does a `.py` path the docs name exist? None where it is not ortlab's to say (another project's path)."""
    if not folders:
        return name in file_names or name in NOT_OURS
    first = folders.split("/")[0]
    packages = {p.name for p in (root / "ortlab").iterdir() if (p / "__init__.py").is_file()}
    if first in packages:  # relative to the package: `runner/local.py`
        return (root / "ortlab" / folders / name).is_file() or (root / folders / name).is_file()
    if first in {"ortlab", "tests", "scripts", "benchmarks", "binder", "notebooks", "docs", "extension"}:
        return (root / folders / name).is_file()
    return None


def _paragraph_end(text: str, at: int) -> int:
    """Where the paragraph holding `text[at]` ends: at a blank line, before a list item or a heading, or at the end
    of a heading's line."""
    end = text.find("\n", at)
    if end < 0:
        return len(text)
    if text.startswith("#", text.rfind("\n", 0, at) + 1):
        return end
    while end < len(text):
        following = text.find("\n", end + 1)
        following = len(text) if following < 0 else following
        line = text[end + 1 : following]
        if not line.strip() or PARAGRAPH_START.match(line):
            return end
        end = following
    return len(text)


def stale_mentions(text: str, root: Path = ROOT, file_names: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, name) of each module, `.py` file or `ortlab/` folder a Markdown text names that does not exist and is
    not followed, in its paragraph, by "(now: ...)" or "(removed: ...)", nor introduced by "was"."""
    file_names = _python_file_names() if file_names is None else file_names
    mentions = []
    for match in PY_PATH.finditer(text):
        if path_exists(match.group(1), match.group(2), root, file_names) is False:
            mentions.append(match)
    mentions += [m for m in ORTLAB_FOLDER.finditer(text) if not (root / m.group(1)).is_dir()]
    mentions += [m for m in DOTTED.finditer(text) if not dotted_exists(m.group(0), root)]
    stale = []
    for match in sorted(mentions, key=lambda m: m.start()):
        if WAS.search(text, max(0, match.start() - 5), match.start()):
            continue
        if not POINTER.search(text, match.end(), _paragraph_end(text, match.end())):
            stale.append((text.count("\n", 0, match.start()) + 1, match.group(0)))
    return stale


def test_every_module_the_docs_name_exists_or_says_where_it_went():
    file_names = _python_file_names()
    stale = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in [README, *DOCS]
        for line, name in stale_mentions(path.read_text(encoding="utf-8"), ROOT, file_names)
    ]
    how = 'follow each with " (now: `new.name`)" or " (removed: what replaced it)" in its paragraph'
    assert not stale, f"{len(stale)} names of modules that no longer exist: {how}\n" + "\n".join(stale)


def test_stale_mentions_reads_paths_dotted_names_and_pointers():
    names = _python_file_names()
    text = (
        "- `ortlab/runner/raychannel.py` and `runner/local.py`\n"
        "- `ortlab.runner.raychannel` (now: `ortlab.job.channel`), `ortlab.runner.launch`, `ortlab.__file__`\n"
        "- `ortlab.train.run.execute`, `ortlab.spec.RunSpec.model_json_schema`\n"
        "- `train/run.py`, which\n  went away long ago (removed: `ortlab/lifecycle/`), `raychannel.py`, `typer.py`,\n"
        "  `ortlab/job/` (was `objsync.py`), `ortlab/cli/` (was cli.py)\n"
        "\n"
        "`ortlab/runner/objsync.py`, with no pointer\n\n"
        "(now: a paragraph later) `transformers/trainer.py` https://example.com/ortlab/x.py `ortlab/runs/`\n"
        "# `ortlab.runner.nothing_such`\n(now: a heading ends its paragraph)\n"
    )
    assert stale_mentions(text, ROOT, names) == [
        (1, "ortlab/runner/raychannel.py"),
        (3, "ortlab.train.run.execute"),
        (5, "raychannel.py"),
        (8, "ortlab/runner/objsync.py"),
        (10, "ortlab/runs/"),
        (11, "ortlab.runner.nothing_such"),
    ]
