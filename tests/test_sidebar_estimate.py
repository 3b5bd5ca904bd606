"""The estimate beside the sidebar's Start button, in a real browser (test_sidebar.py's JupyterLab and chromium).

The New run form asks `POST estimate` a moment after the last change (typing a batch size is one request, not one
per keystroke; an older answer that arrives after a newer one is dropped) and shows the server's answer for the
spec the form would launch: peak memory of what this machine has, time per step and for the run, the cost once a
price is given, what a budget would change; a bigger batch predicts more memory and a shorter max_length less; a
batch far beyond this machine says plainly that it does not fit, with the refusal Launch would give; a spec that
cannot be estimated says why in one line, as text.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from lab_server import CHROMIUM, CHROMIUM_ARGS, open_runs_panel
from page_errors import assert_no_page_errors, wait_until, watch_page_errors
from test_sidebar import ARTIFACTS, MARKUP, TOKEN, lab_with_ortlab  # noqa: F401 (the fixture)

from ortlab.server.actions import estimate_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _peak_mib(text: str) -> float:
    value, unit = re.search(r"peak memory ≈ ([\d.]+) (MiB|GiB)", text).groups()
    return float(value) * (1024 if unit == "GiB" else 1)


class Estimates:
    """The form's estimate requests and answers as the browser sees them, and the line once it has settled."""

    def __init__(self, page):
        self.page = page
        self.sent: list[dict] = []
        self.answers: list[dict] = []
        page.on("request", self._request)
        page.on("response", self._response)

    def _request(self, request) -> None:
        if request.url.split("?")[0].endswith("/ortlab/api/estimate"):
            self.sent.append(json.loads(request.post_data))

    def _response(self, response) -> None:
        if response.url.split("?")[0].endswith("/ortlab/api/estimate") and response.ok:
            self.answers.append(response.json())

    @property
    def line(self):
        return self.page.locator("form.ortlab-NewRun .ortlab-Estimate")

    def settled(self, state: str, before: str = "", timeout: float = 60) -> str:
        """The estimate's text once its newest request has answered with `state` (and it differs from `before`)."""

        def shown():
            line = self.line
            if line.get_attribute("data-pending") != "false" or line.get_attribute("data-state") != state:
                return None
            text = line.inner_text()
            return text if text != before else None

        return wait_until(shown, timeout, f"the estimate to show {state!r} (it says {self.line.inner_text()!r})")


def test_the_sidebar_estimate_follows_the_form(lab_with_ortlab, tmp_path):  # noqa: F811 (test_sidebar's fixture)
    from playwright.sync_api import sync_playwright

    url, folder = lab_with_ortlab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1500})  # the whole form, its estimate too
        errors = watch_page_errors(page)
        estimates = Estimates(page)
        try:
            panel = open_runs_panel(page, url, TOKEN)
            panel.locator(".ortlab-NewRunButton").click()
            form = page.locator("form.ortlab-NewRun")
            form.wait_for(timeout=60_000)
            form.locator('input[name="max_steps"]').fill("200")

            # The form's defaults (the embedded MiniLM on Rotten Tomatoes): the server's estimate of the very spec
            # the form sent, peak of what the machine has, step time and the whole run.
            first = estimates.settled("ok")
            assert "s/step" in first and "in all" in first and "available on cpu" in first, first
            sent = estimates.sent[-1]
            assert sent["spec"]["hyper"]["max_steps"] == 200 and "name" not in sent["spec"], sent
            server = estimate_in(sent["spec"], None, None, folder)
            assert _peak_mib(first) == pytest.approx(server["peak_mem_mb"]["value"], rel=0.06), (first, server)
            assert "200 steps" in first, first

            # Typed a character at a time: one request after the last keystroke, not one per keystroke.
            asked = len(estimates.sent)
            batch = form.locator('input[name="batch_size"]')
            batch.fill("")
            batch.press_sequentially("64", delay=60)
            bigger = estimates.settled("ok", first)
            assert len(estimates.sent) == asked + 1, estimates.sent[asked:]
            assert estimates.sent[-1]["spec"]["hyper"]["batch_size"] == 64
            assert _peak_mib(bigger) > _peak_mib(first), (first, bigger)
            # A later request wins: the answer for batch 32 held back until the one for batch 4 has shown, then let
            # through, changes nothing.
            held = []
            page.route("**/ortlab/api/estimate*", lambda route: held.append(route) if not held else route.continue_())
            batch.fill("32")
            wait_until(_pumped(page, lambda: held), 30, "the estimate for batch 32 to be asked")
            batch.fill("4")
            newer = estimates.settled("ok", bigger)
            answered = len(estimates.answers)
            held[0].continue_()
            wait_until(_pumped(page, lambda: len(estimates.answers) > answered), 30, "the held answer to arrive")
            page.unroute("**/ortlab/api/estimate*")
            assert estimates.answers[-1]["batch"] == 32 and _peak_mib(newer) < _peak_mib(bigger), newer
            time.sleep(0.3)  # (React has had its chance to draw the stale answer)
            assert estimates.line.inner_text() == newer
            batch.fill("64")
            bigger = estimates.settled("ok", newer)

            # A shorter max_length (the data's rows are longer than 16 tokens): less memory.
            form.locator('input[name="hyper.max_length"]').fill("16")
            shorter = estimates.settled("ok", bigger)
            assert estimates.sent[-1]["spec"]["hyper"]["max_length"] == 16
            assert _peak_mib(shorter) < _peak_mib(bigger), (bigger, shorter)

            # A price: the run's cost. A budget of minutes that holds a few of the 200 steps: what Launch would
            # change to fit it, from the launch's own fit (the server's `fitted`).
            form.locator('input[name="price_per_hour"]').fill("2.5")
            priced = estimates.settled("ok", shorter)
            assert re.search(r"cost ≈ \d+\.\d\d", priced), priced
            est = estimates.answers[-1]
            minutes = (est["total_time_s"]["value"] - 190 * est["step_time_s"]["value"]) / 60
            form.locator('input[name="budget.minutes"]').fill(f"{minutes:.3f}")
            fitted = estimates.settled("ok", priced)
            budget = form.locator(".ortlab-Estimate-budget").inner_text()
            assert budget.startswith("budget: max_steps") and budget == "budget: " + "; ".join(
                estimates.answers[-1]["fitted"]
            ), budget
            assert estimates.answers[-1]["steps"] < 200, estimates.answers[-1]["steps"]
            _screenshot_form(page, "sidebar-estimate.png")
            form.locator('input[name="budget.minutes"]').fill("")  # empty: no budget
            estimates.settled("ok", fitted)
            assert form.locator(".ortlab-Estimate-budget").count() == 0

            # Far beyond this machine: "does not fit", plainly, with the refusal Launch would give.
            batch.fill("1048576")
            form.locator('input[name="hyper.max_length"]').fill("512")
            huge = estimates.settled("nofit")
            assert huge.startswith("does not fit: biggest term activations"), huge
            refusal = form.locator(".ortlab-Estimate-refusal").inner_text()
            assert refusal.startswith("this run needs about") and "Remedies" in refusal, refusal
            _screenshot_form(page, "sidebar-estimate-nofit.png")

            # A spec that cannot be estimated: why, in one line (a bad field; a model that is not here, whose
            # name with markup in it shows as text).
            batch.fill("0")
            bad = estimates.settled("error")
            assert bad.startswith("no estimate: invalid run spec: ") and "batch_size" in bad and "\n" not in bad, bad
            batch.fill("8")
            form.locator('input[name="model"]').fill(f"{tmp_path}/{MARKUP}")
            missing = estimates.settled("error", bad)
            assert missing.startswith("no estimate: ") and MARKUP in missing and "\n" not in missing, missing
            assert form.locator(".ortlab-Estimate img").count() == 0
            assert page.evaluate("() => window.__ortlabXSS") is None
            assert not (folder / "runs").exists() or list((folder / "runs").iterdir()) == []
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "sidebar-estimate-failure.png"))
            raise
        finally:
            browser.close()


def _pumped(page, predicate):
    """`predicate` after a moment in playwright's hands: its sync API delivers events (a routed request, a
    response) only while the test is inside one of its calls."""
    return lambda: page.wait_for_timeout(50) or predicate()


def _screenshot_form(page, name: str) -> Path:
    """The sidebar's New run form with its estimate, as a user sees it."""
    path = ARTIFACTS / name
    time.sleep(0.2)  # the pending fade's end
    page.locator("#ortlab-runs").screenshot(path=str(path))
    return path
