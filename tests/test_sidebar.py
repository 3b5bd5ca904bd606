"""The JupyterLab sidebar in a real browser: JupyterLab with ortlab's server extension and the prebuilt sidebar
(from this checkout's ortlab/labextension), driven by Debian's chromium.

The test opens the sidebar from the command palette, checks that the New run form draws each task's own fields
(its record's, as the server sends them: preference's loss, beta and reference), sends a bad run from the form (the
server's field-by-field problems show inline), then launches a tiny BERT run with 100000 steps from the same form,
watches its step count and its loss sparkline grow while the run folder says "running", measures how long a metrics
record takes from being written to being drawn, stops the run with its Stop button and sees `stopped`.
Screenshots in the light and the dark theme go to test-artifacts/; docs/sidebar.png, the README's picture, is a
copy of the light one.

A second test shows a running run with a 100,000-step history: its sparklines draw the whole run (first step to
newest) in a bounded number of points, its early extremes where they were, and keep up as steps are appended.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT
from fake_runs import append, make_fake_run, step_record
from lab_server import (
    CHROMIUM,
    CHROMIUM_ARGS,
    open_runs_panel,
    ortlab_lab_options,
    show_runs_panel,
    start_lab,
    stop_if_running,
    wait_for_lab,
)
from page_errors import assert_no_page_errors, wait_until, watch_page_errors

from ortlab import safeio
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import TASKS, HyperSpec, PreferenceSpec, RunSpec
from ortlab.specfields import SpecFields
from ortlab.tasks import get_task
from ortlab.toggles import field_values, form_toggles

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "ortlab-sidebar-test"
RUN = "sidebar-run"


@pytest.fixture
def lab_with_ortlab(tmp_path):
    """JupyterLab on a free loopback port with ortlab's server extension on (runs root: tmp_path/runs) and this
    checkout's prebuilt sidebar first on the labextensions path (JUPYTER_PATH wins over the installed copy)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    # The doctor's report, cached for this environment (the server answers from the cache only): the panel's
    # doctor line and the New run form's mix toggles show what it found. Seconds when cached, about a minute not.
    from ortlab.probe import doctor

    doctor()
    args, extra_env = ortlab_lab_options(tmp_path, tmp_path / "runs")
    with start_lab(tmp_path, TOKEN, args, extra_env) as url:
        # The sidebar talks to the server extension: without it the test would only see the panel's error line.
        with urllib.request.urlopen(f"{url}/ortlab/api/runs?token={TOKEN}", timeout=30) as r:
            assert "runs" in json.load(r), "ortlab's server extension does not answer"
        yield url, tmp_path


def _run_card(page):
    return page.locator(f'.ortlab-Run[data-run-id="{RUN}"]')


def _step_shown(page) -> int:
    card = _run_card(page)
    if card.count() == 0:
        return 0
    m = re.search(r"(\d+)", card.locator(".ortlab-Run-step").inner_text())
    return int(m.group(1)) if m else 0


def _loss_points(page) -> int:
    spark = _run_card(page).locator(".ortlab-Sparkline-loss")
    return int(spark.get_attribute("data-points") or 0) if spark.count() else 0


def _state_shown(page) -> str:
    card = _run_card(page)
    return (card.get_attribute("data-state") or "") if card.count() else ""


MARKUP = "<img src=x onerror=window.__ortlabXSS=1>"
FAILURE = f"ValueError: the data's label {MARKUP!r} is not one of the spec's labels ['neg', 'pos']"


def _fill_form(page, model: str, max_steps: str) -> None:
    form = page.locator("form.ortlab-NewRun")
    form.locator('input[name="name"]').fill(RUN)
    form.locator('input[name="model"]').fill(model)
    form.locator('input[name="data"]').fill("embedded:rotten-tomatoes")
    form.locator('input[name="max_steps"]').fill(max_steps)
    form.locator('input[name="batch_size"]').fill("8")
    # An explicit mix (plain PyTorch): 'auto' would measure the mixes first on a 100000-step run.
    auto = form.locator('input[name="auto"]')
    if auto.is_checked():
        auto.uncheck()
    form.locator("button.ortlab-Launch").click()


def _screenshot(page, name: str) -> Path:
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


def test_sidebar_launches_watches_and_stops_a_run(lab_with_ortlab, tiny_bert):
    from playwright.sync_api import sync_playwright

    url, folder = lab_with_ortlab
    run_dir = folder / "runs" / RUN
    ARTIFACTS.mkdir(exist_ok=True)
    # A finished two-worker cluster run that was restarted once (its stream as a Ray Train run writes it): its card
    # says so.
    two = make_fake_run(folder / "runs", "two-workers", state="completed", steps=3, max_steps=3)
    restart = {
        "event": "restart",
        "attempt": 1,
        "failed_workers": [1],
        "reason": "rank 1: died",
        "resumes_from_step": 2,
    }
    append(two / "metrics.jsonl", {"event": "train_begin", "max_steps": 3, "world_size": 2}, restart)
    # A damaged folder (its status.json a link) and a failed run: each card says why, as text (markup from a
    # folder is shown, never rendered).
    damaged = make_fake_run(folder / "runs", "damaged", state="stopped", steps=1, max_steps=3)
    (damaged / "status.json").unlink()
    (damaged / "status.json").symlink_to(folder / "elsewhere.json")
    failed = make_fake_run(folder / "runs", "failed", state="failed", steps=1, max_steps=3)
    status = json.loads((failed / "status.json").read_text())
    safeio.write_json(failed, "status.json", {**status, "error": FAILURE})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = watch_page_errors(page)
        try:
            page.goto(f"{url}/lab?token={TOKEN}", timeout=90_000)
            wait_for_lab(page)  # the tab is there with its own icon; the palette entry opens the panel
            panel = show_runs_panel(page)
            page.wait_for_selector("#ortlab-runs .ortlab-Doctor-line", timeout=60_000)
            assert panel.locator(".ortlab-Error").count() == 0, panel.locator(".ortlab-Error").all_inner_texts()
            card = panel.locator('.ortlab-Run[data-run-id="two-workers"]')
            card.locator(".ortlab-Run-restarts").wait_for(timeout=60_000)
            assert card.locator(".ortlab-Run-workers").inner_text() == "2 workers"
            assert card.locator(".ortlab-Run-restarts").inner_text() == "1 restart"
            card = panel.locator('.ortlab-Run[data-run-id="damaged"]')
            card.locator(".ortlab-Run-error").wait_for(timeout=60_000)
            assert card.get_attribute("data-state") == "damaged"
            assert "status.json" in card.locator(".ortlab-Run-error").inner_text()
            card = panel.locator('.ortlab-Run[data-run-id="failed"]')
            assert card.locator(".ortlab-Run-error").inner_text() == FAILURE
            assert card.locator(".ortlab-Run-error img").count() == 0
            assert page.evaluate("() => window.__ortlabXSS") is None

            # A bad spec: the server's field-by-field problems show inline, and no run folder is made.
            page.locator("#ortlab-runs .ortlab-NewRunButton").click()
            # The form is built from the server's RunSpec schema: every task (seq2seq too), the spec's defaults,
            # and the field descriptions as tooltips.
            form = page.locator("form.ortlab-NewRun")
            form.wait_for(timeout=60_000)
            options = form.locator('select[name="task"] option').evaluate_all("els => els.map(e => e.value)")
            assert options == list(TASKS), options
            assert form.locator('select[name="task"]').input_value() == RunSpec().task
            assert form.locator('input[name="batch_size"]').input_value() == str(HyperSpec().batch_size)
            tip = form.locator("label.ortlab-Field", has=page.locator('select[name="task"]')).get_attribute("title")
            assert tip == RunSpec.model_fields["task"].description, tip
            # The mix toggles are the server's one list (ortlab.toggles), names and labels, after 'auto'.
            shown = form.locator("fieldset.ortlab-Mix input[type=checkbox]").evaluate_all(
                "els => els.map(e => [e.name, e.parentElement.querySelector('span').textContent])"
            )
            assert shown[1:] == [[t.name, t.label] for t in form_toggles()], shown
            # Each task's own fields are the ones its record names (`tasks` in GET spec), drawn from the schema:
            # preference shows its loss (the spec's choices), beta and reference at the spec's defaults.
            task_select = form.locator('select[name="task"]')
            task_inputs = form.locator("fieldset.ortlab-TaskFields").locator("input, select")
            names = "els => els.map(e => e.name)"
            assert task_inputs.evaluate_all(names) == list(get_task(RunSpec().task).form)
            task_select.select_option("preference")
            assert task_inputs.evaluate_all(names) == list(get_task("preference").form)
            loss = form.locator('select[name="preference.loss"]')
            loss_options = loss.locator("option").evaluate_all("els => els.map(e => e.value)")
            assert loss_options == list(SpecFields().choices("preference.loss")), loss_options
            assert loss.input_value() == PreferenceSpec().loss
            assert form.locator('input[name="preference.beta"]').input_value() == str(PreferenceSpec().beta)
            assert form.locator('select[name="preference.reference"]').input_value() == PreferenceSpec().reference
            _screenshot(page, "sidebar-form-preference.png")
            task_select.select_option(RunSpec().task)
            _fill_form(page, str(tiny_bert), "0")
            problems = page.locator("form.ortlab-NewRun .ortlab-Problems li")
            problems.first.wait_for(timeout=60_000)
            assert any("max_steps" in t for t in problems.all_inner_texts()), problems.all_inner_texts()
            assert not run_dir.exists()
            # For eyes: the form with its problems, the mix toggles with the doctor's reasons, and those reasons.
            details = panel.locator(".ortlab-Doctor-details")
            if details.count():
                details.locator("summary").click()
            _screenshot(page, "sidebar-form.png")
            if details.count():
                details.locator("summary").click()

            # A tiny run with far more steps than the test waits for: it is running whenever the checks look.
            launched_at = time.time()
            off = field_values(set())
            _fill_form(page, str(tiny_bert), "100000")
            page.wait_for_selector("form.ortlab-NewRun .ortlab-Ok", timeout=120_000)
            page.locator("form.ortlab-NewRun button.jp-mod-reject").click()  # close the form
            _run_card(page).wait_for(timeout=60_000)
            # No toggle ticked: every field the toggles set is sent, each at its 'off' (plain PyTorch, fp32).
            accel = RunSpec.from_run(RunDir(run_dir)).accel
            assert {f"accel.{k}": v for k, v in accel.model_dump().items() if f"accel.{k}" in off} == off
            wait_until(lambda: _state_shown(page) == "running", 300, "the sidebar to show the run running")
            assert _run_card(page).locator(".ortlab-Run-workers").count() == 0, "one process: no workers count"
            # Record when each step is drawn (page clock, epoch seconds) to compare with the metrics' times.
            page.evaluate(
                """(run) => {
                    window.__ortlabDrawn = [];
                    const seen = new Set();
                    new MutationObserver(() => {
                        const el = document.querySelector(`.ortlab-Run[data-run-id="${run}"] .ortlab-Run-step`);
                        const m = el && el.textContent.match(/(\\d+)/);
                        if (m && !seen.has(m[1])) {
                            seen.add(m[1]);
                            window.__ortlabDrawn.push([Number(m[1]), Date.now() / 1000]);
                        }
                    }).observe(document.querySelector('#ortlab-runs'),
                               {subtree: true, childList: true, characterData: true});
                }""",
                RUN,
            )
            first_points = wait_until(lambda: _loss_points(page), 300, "the first point of the loss sparkline")
            first_step = _step_shown(page)
            assert json.loads((run_dir / "status.json").read_text())["state"] == "running"
            wait_until(lambda: _loss_points(page) >= first_points + 10, 300, "the loss sparkline to grow")
            assert _step_shown(page) > first_step, "the step count grows"
            assert _run_card(page).locator(".ortlab-Sparkline-speed").get_attribute("data-points") not in (None, "0")
            assert json.loads((run_dir / "status.json").read_text())["state"] == "running", "it grew while running"

            # From metric written to drawn: each step record's own time against the moment its step was drawn. A fast
            # run draws only the newest of several steps per poll: wait for enough draws to take a median of.
            wait_until(
                lambda: len(page.evaluate("() => window.__ortlabDrawn")) >= 6, 120, "six updates of the step count"
            )
            drawn = page.evaluate("() => window.__ortlabDrawn")
            written = {}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines():
                record = json.loads(line)
                if record.get("event") == "step":
                    written.setdefault(record["step"], record["time"])
            latencies = [t - written[s] for s, t in drawn if s in written and written[s] > launched_at]
            (ARTIFACTS / "sidebar-latency.json").write_text(
                json.dumps({"latencies_s": latencies, "drawn": drawn}, indent=1)
            )
            assert len(latencies) >= 5, drawn
            assert statistics.median(latencies) <= 1.0, latencies

            assert page.get_by_text("official Jupyter news").count() == 0, "the news toast covers the page"
            light = _screenshot(page, "sidebar.png")
            page.click("text=Settings >> nth=0")
            page.hover("text=Theme")
            page.get_by_text("JupyterLab Dark", exact=True).click()
            page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
            page.wait_for_function("() => !document.querySelector('#jupyterlab-splash')", timeout=30_000)
            wait_until(lambda: _state_shown(page) == "running", 60, "the panel after the theme change")
            _screenshot(page, "sidebar-dark.png")
            shutil.copyfile(light, ROOT / "docs" / "sidebar.png")

            # Stop from the panel: the run finishes its step, saves a checkpoint and ends `stopped`.
            _run_card(page).locator("button.ortlab-Stop").click()
            wait_until(lambda: json.loads((run_dir / "status.json").read_text())["state"] == "stopped", 300, "the stop")
            wait_until(lambda: _state_shown(page) == "stopped", 60, "the sidebar to show 'stopped'")
            assert _run_card(page).locator("button.ortlab-Resume").count() == 1
            _screenshot(page, "sidebar-stopped-dark.png")

            # "Open in a notebook": a notebook attached to the run, with its live charts, opens in the main area.
            _run_card(page).locator("button.ortlab-OpenNotebook").click()
            page.wait_for_selector(".jp-NotebookPanel", timeout=60_000)
            notebook = json.loads((folder / f"ortlab-{RUN}.ipynb").read_text())
            source = "".join(notebook["cells"][0]["source"])
            assert f'ortlab.attach("{RUN}", root="{(folder / "runs").resolve()}")' in source
            assert "RunMonitor(run)" in source
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "sidebar-failure.png"))
            raise
        finally:
            browser.close()
            stop_if_running(run_dir)


LONG = "long-run"
LONG_STEPS = 100_000
SPIKE, STALL = 3_000, 7_000  # the loss's highest point and the samples/s' lowest, early in the run
SPARKLINE_POINTS = 200  # the sidebar's default (schema/plugin.json): a sparkline holds at most twice as many


def _long_record(step: int) -> dict:
    loss = 50.0 if step == SPIKE else 2.0 / (1 + step / 1000)
    return step_record(step, loss=loss, samples_per_s=1.0 if step == STALL else 40.0 + step % 3)


def _sparkline(page, kind: str) -> dict:
    """What a sparkline of the long run's card covers (its data attributes) and where its line's highest and lowest
    points are drawn (x in the SVG's 0..120 by step; y grows downwards)."""
    return page.evaluate(
        """([run, kind]) => {
            const el = document.querySelector(`.ortlab-Run[data-run-id="${run}"] .ortlab-Sparkline-${kind}`);
            if (!el) return null;
            const line = el.querySelector('polyline');
            const xy = line ? line.getAttribute('points').split(' ').map(p => p.split(',').map(Number)) : [];
            const ys = xy.map(p => p[1]);
            const top = xy[ys.indexOf(Math.min(...ys))], bottom = xy[ys.indexOf(Math.max(...ys))];
            return {first: Number(el.dataset.firstStep), last: Number(el.dataset.lastStep),
                    points: Number(el.dataset.points), top_x: top ? top[0] : null, bottom_x: bottom ? bottom[0] : null};
        }""",
        [LONG, kind],
    )


def _card_state(page) -> str:
    card = page.locator(f'.ortlab-Run[data-run-id="{LONG}"]')
    return (card.get_attribute("data-state") or "") if card.count() else ""


def _loss_reaching(page, step: int):
    """A predicate for `wait_until`: the loss sparkline's attributes once its newest step is `step`."""
    return lambda: (shown := _sparkline(page, "loss")) and shown["last"] == step and shown


def test_sidebar_draws_a_long_run_whole_at_bounded_points(lab_with_ortlab):
    """A running run with a history of 100,000 steps: its sparklines cover the whole run (its first step to its
    newest) in at most 2 * 200 points, keep an early loss spike and an early stall of samples/s where they were,
    keep up, still whole and bounded, as more steps are written than a sparkline holds, and end at its last step
    when it ends."""
    from playwright.sync_api import sync_playwright

    url, folder = lab_with_ortlab
    run = make_fake_run(folder / "runs", LONG, state="running", steps=0, max_steps=2 * LONG_STEPS)
    append(run / "metrics.jsonl", *(_long_record(s) for s in range(1, LONG_STEPS + 1)))
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = watch_page_errors(page)
        try:
            open_runs_panel(page, url, TOKEN)
            shown = wait_until(_loss_reaching(page, LONG_STEPS), 120, "the long run's loss sparkline to be drawn")
            assert shown["first"] == 1, shown  # the whole run, not its tail
            assert 10 <= shown["points"] <= 2 * SPARKLINE_POINTS, shown
            # Drawn by step: the spike at 3 % of the run is the loss line's highest point, 3 % from its left.
            assert shown["top_x"] == pytest.approx(120 * (SPIKE - 1) / (LONG_STEPS - 1), abs=1.5), shown
            speed = _sparkline(page, "speed")
            assert speed["first"] == 1 and speed["last"] == LONG_STEPS, speed
            assert speed["bottom_x"] == pytest.approx(120 * (STALL - 1) / (LONG_STEPS - 1), abs=1.5), speed

            # The run goes on: 1,200 more steps in batches, more than the 400 points a sparkline holds.
            last = LONG_STEPS
            for _ in range(4):
                append(run / "metrics.jsonl", *(_long_record(s) for s in range(last + 1, last + 301)))
                last += 300
                shown = wait_until(_loss_reaching(page, last), 60, f"the loss sparkline to reach step {last}")
                assert shown["first"] == 1 and shown["points"] <= 2 * SPARKLINE_POINTS, shown
                assert shown["top_x"] == pytest.approx(120 * (SPIKE - 1) / (last - 1), abs=1.5), shown
            speed = _sparkline(page, "speed")
            assert speed["first"] == 1 and speed["last"] == last and speed["points"] <= 2 * SPARKLINE_POINTS, speed
            assert speed["bottom_x"] == pytest.approx(120 * (STALL - 1) / (last - 1), abs=1.5), speed

            # While it runs, the panel polls at a pace set by what a poll costs: at most 2.5 % of the time (its
            # requests to its paint), never more often than liveInterval (500 ms), never less than every 5 s.
            pace = page.evaluate(
                """() => { const b = document.querySelector('.ortlab-Sidebar-body');
                           return {poll: Number(b.dataset.pollMs), wait: Number(b.dataset.waitMs)}; }"""
            )
            assert pace["poll"] > 0, pace
            assert pace["wait"] == pytest.approx(min(5000, max(500, pace["poll"] / 0.025)), abs=25), pace

            # Its last steps and its end together (between two polls): the panel reads the run once more after it
            # ended, so the sparkline ends at the run's last step.
            append(run / "metrics.jsonl", *(_long_record(s) for s in range(last + 1, last + 51)))
            RunDir(run).set_status("completed", step=last + 50)
            wait_until(lambda: _card_state(page) == "completed", 60, "the sidebar to show the run completed")
            shown = wait_until(_loss_reaching(page, last + 50), 10, "the loss sparkline to reach the run's last step")
            assert shown["first"] == 1 and shown["points"] <= 2 * SPARKLINE_POINTS, shown
            page.screenshot(path=str(ARTIFACTS / "sidebar-long-run.png"))
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "sidebar-long-run-failure.png"))
            raise
        finally:
            browser.close()
