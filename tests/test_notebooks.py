"""Every tutorial notebook runs top to bottom through papermill in smoke mode; a failing cell fails the test.

The executed notebooks are kept in test-artifacts/notebooks/ (with their outputs), rendered to HTML by nbconvert
and screenshotted in chromium (NAME.html, NAME.png), so a person can read them as a user would; the test reads
them too: no error, no wall of library warnings.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from ortlab.notebooks import NotebookFailed, parameter_names, run_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The notebooks that show their runs' curves (a RunMonitor): their saved output must hold the finished runs.
CHARTED = {
    "01-quickstart",
    "02-acceleration-tour",
    "04-bring-your-own-data",
    "06-train-on-a-cluster",
    "07-align-with-preferences",
}
# The notebooks that train on the local Ray cluster: they get the session's (conftest `ray_head`), as a user's
# notebook finds one already running.
ON_CLUSTER = {"06-train-on-a-cluster"}
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def render(executed: Path) -> tuple[Path, Path]:
    """The executed notebook as a reader sees it: HTML (nbconvert) and a full-page chromium screenshot of it."""
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright
    from traitlets.config import Config

    # The widgets' own JavaScript comes from a CDN, which a static page offline cannot load (they render empty):
    # show the static view ortlab puts beside each widget (its text/html fallback) instead, as a reader without
    # a kernel would want.
    priority = [m for m in HTMLExporter().default_config.NbConvertBase.display_data_priority if "widget" not in m]
    exporter = HTMLExporter(config=Config({"NbConvertBase": {"display_data_priority": priority}}))
    body, _ = exporter.from_filename(str(executed))
    html_path = executed.with_suffix(".html")
    html_path.write_text(body, encoding="utf-8")
    png = executed.with_suffix(".png")
    with sync_playwright() as p:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(html_path.resolve().as_uri(), wait_until="load", timeout=60_000)
            page.screenshot(path=str(png), full_page=True)
        finally:
            browser.close()
    return html_path, png


def warnings_shown(nb) -> list[str]:
    """Lines of library noise in the notebook's output (what a reader would have to scroll past): warnings
    (`UserWarning: ...`, `[WARNING] ...`, `root [WARNING] - ...`) on stdout or stderr, and progress bars."""
    lines = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                lines += [line for line in out.get("text", "").splitlines() if re.search(r"warning\b", line, re.I)]
            # Library progress bars (tqdm widgets: "Loading weights:  0%|  | 0/105") left in the output.
            text = out.get("data", {}).get("text/plain", "")
            lines += [line for line in text.splitlines() if re.search(r"\d+%\|", line)]
    return lines


def test_there_are_tutorials():
    assert [p.name for p in NOTEBOOKS] == [
        "01-quickstart.ipynb",
        "02-acceleration-tour.ipynb",
        "03-export-and-push.ipynb",
        "04-bring-your-own-data.ipynb",
        "05-small-llm-lora.ipynb",
        "06-train-on-a-cluster.ipynb",
        "07-align-with-preferences.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_clean_and_parameterized(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"), (
        "notebooks are committed without outputs"
    )
    assert "smoke" in parameter_names(path)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 2, "each notebook explains what and why in prose"


# What a notebook's later cells use, by the extra that provides it: its install cell must ask for that extra (on Colab
# nothing else installs it; notebook 07 once asked for `ui` alone and would have failed there without peft).
EXTRA_USES = {
    "llm": r'"kind": "lora"|\bgguf\b',
    "remote": r"\bortlab\.cluster\b|from ortlab import cluster",
    "export": r"\.export\(|\bonnx",
}
INSTALL_LINE = re.compile(r'^extras, needs = "([a-z,]+)", \(([^)]*)\).*$', re.M)


def install_cell(nb) -> str:
    return next(c.source for c in nb.cells if c.cell_type == "code")


def test_every_install_cell_is_the_quickstarts_with_the_extras_its_notebook_uses():
    import tomllib

    extras_declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    canonical = INSTALL_LINE.sub("", install_cell(nbformat.read(NOTEBOOKS[0], as_version=4)))
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cell = install_cell(nb)
        (found,) = INSTALL_LINE.findall(cell) or [(None, None)]
        assert found[0], f"{path.name}: its first code cell is not the install cell"
        assert INSTALL_LINE.sub("", cell) == canonical, f"{path.name}: the install cell differs from the quickstart's"
        extras = set(found[0].split(","))
        assert extras <= extras_declared, f"{path.name}: pyproject.toml has no extra {extras - extras_declared}"
        later = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and c.source != cell)
        needed = {extra for extra, uses in EXTRA_USES.items() if re.search(uses, later)}
        assert needed <= extras, f"{path.name} uses {sorted(needed - extras)} but its install cell does not install it"


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.stem, marks=[pytest.mark.xdist_group("ray-cluster")] if p.stem in ON_CLUSTER else [])
        for p in NOTEBOOKS
    ],
)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch, request):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if path.stem in ON_CLUSTER:
        request.getfixturevalue("ray_head")  # (its folder is in the environment the notebook's kernel inherits)
    out = run_notebook(
        path, ARTIFACTS / path.name, {"smoke": True, "runs_folder": str(tmp_path / "runs")}, cwd=tmp_path
    )
    executed = nbformat.read(out, as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    html_path, png = render(out)
    page = html_path.read_text(encoding="utf-8")
    assert png.stat().st_size > 10_000 and "ortlab" in page
    assert warnings_shown(executed) == [], "library warnings reached the notebook's output"
    if path.stem in CHARTED:
        assert_shows_finished_runs(page, tmp_path / "runs")


def assert_shows_finished_runs(page: str, runs_folder: Path) -> None:
    """The HTML a reader gets draws each run's logged train losses (an SVG curve whose points are those losses)
    and no run view was left saying a run is pending or running: they all ended before the notebook did."""
    from svg_points import assert_drawn, series

    from ortlab.runner import runs

    curves = series(page)
    assert curves, "no chart in the executed notebook's HTML"
    drawn = 0
    for run in runs(runs_folder):
        losses = [r["loss"] for r in run.metrics() if r.get("event") == "step"]
        for label, points in curves.items():
            if label.startswith(f"{run.id} [") and label.endswith("(train)"):
                assert_drawn([y for _, y in points], losses, increasing=False)
                drawn += 1
    assert drawn, f"no run of {runs_folder} is drawn; curves: {sorted(curves)}"
    assert ">pending<" not in page and ">running<" not in page, "a run view kept a state from before the run ended"


def test_a_failing_cell_fails_the_run(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("smoke = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("assert not smoke, 'smoke mode reached the failing cell'")]
    nbformat.write(nb, tmp_path / "fails.ipynb")
    with pytest.raises(NotebookFailed, match="AssertionError: smoke mode reached the failing cell"):
        run_notebook(tmp_path / "fails.ipynb", tmp_path / "out.ipynb", {"smoke": True})
    with pytest.raises(ValueError, match="no parameter"):
        run_notebook(tmp_path / "fails.ipynb", tmp_path / "out.ipynb", {"smokey": True})
    assert Path(tmp_path / "out.ipynb").exists()
