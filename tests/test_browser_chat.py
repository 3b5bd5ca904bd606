"""The chat playground (`run.chat()`) in a real browser: JupyterLab (a real jupyter_server and kernel) driven by
Debian's chromium. A prompt typed in the page goes to the LoRA run's model and to its base model; both panes stream
(the reply grows while its cursor shows); a second cell runs and finishes while both still answer (the kernel is
free); Stop in the page ends both, and the exchange is in the run folder. A screenshot is kept in test-artifacts/.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from lab_server import CHROMIUM, CHROMIUM_ARGS, start_lab
from page_errors import assert_no_page_errors, wait_until, watch_page_errors

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "ortlab-browser-chat-test"
PROMPT = "Is review 3 fresh?"


@pytest.fixture
def jupyter_lab(tmp_path, chat_lora_run):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import ortlab\npg = ortlab.attach({str(chat_lora_run)!r}).chat()\n"
            "pg.temperature.value, pg.max_new_tokens.value = 0.0, 2048  # greedy: this tiny model never stops\npg"
        ),
        nbformat.v4.new_code_cell(f"import time\nopen({str(tmp_path / 'alive.txt')!r}, 'w').write(str(time.time()))"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "chat.ipynb")
    with start_lab(tmp_path, TOKEN) as url:
        yield url, tmp_path, chat_lora_run


def _panes(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('.ortlab-chat-pane')].map(p => p.innerText)")


def test_two_models_answer_side_by_side_stream_stop_and_the_kernel_stays_free(jupyter_lab):
    from playwright.sync_api import sync_playwright

    url, folder, run = jupyter_lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        errors = watch_page_errors(page)
        try:
            page.goto(f"{url}/lab/tree/chat.ipynb?token={TOKEN}", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
            page.locator(".jp-Cell").nth(0).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            page.locator(".ortlab-chat-prompt textarea").wait_for(timeout=120_000)
            # Both servers up: each pane names its model once it has loaded.
            wait_until(lambda: all("loading" not in t for t in _panes(page)) and len(_panes(page)) == 2, 300, "models")
            assert "chat-lora" in _panes(page)[0] and "chat-lora:base" in _panes(page)[1]
            page.locator(".ortlab-chat-prompt textarea").fill(PROMPT)
            page.locator("button.ortlab-chat-send").click()
            # Streamed: each pane's reply grows while its cursor (▍) shows.
            first = wait_until(lambda: all("▍" in t for t in _panes(page)) and _panes(page), 60, "both replies")
            wait_until(
                lambda: all(len(b) > len(a) + 5 and "▍" in b for a, b in zip(first, _panes(page), strict=True)),
                60,
                "both replies to grow",
            )
            # The kernel is free: the second cell runs and finishes while both models answer.
            page.locator(".jp-Cell").nth(1).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            wait_until(lambda: (folder / "alive.txt").exists(), 60, "the second cell to run")
            assert all("▍" in t for t in _panes(page)), "both still answering when the other cell ran"
            page.screenshot(path=str(ARTIFACTS / "chat-playground.png"), full_page=True)
            page.locator("button.ortlab-chat-stop").click()
            wait_until(lambda: all("▍" not in t for t in _panes(page)), 30, "Stop to end both replies")
            # Stop, once more with nothing in between: asked again, stopped as soon as both stream (on a quiet
            # machine this tiny model can write its 2048 tokens before the first Stop above gets there).
            page.get_by_role("button", name="New chat").click()  # (a 2048-token first reply leaves no room)
            page.locator(".ortlab-chat-prompt textarea").fill(PROMPT)
            page.locator("button.ortlab-chat-send").click()
            wait_until(lambda: all("▍" in t for t in _panes(page)), 60, "both replies again")
            page.locator("button.ortlab-chat-stop").click()
            wait_until(lambda: all("▍" not in t for t in _panes(page)), 30, "Stop to end both replies")
            records = wait_until(lambda: list((run / "chats").glob("*.jsonl")), 10, "the saved chats")
            lines = [json.loads(x) for f in records for x in f.read_text().splitlines()]
            assert len(lines) == 4, lines  # two exchanges, each model's reply a line
            latest = max(records, key=lambda f: f.stat().st_mtime).read_text().splitlines()
            # Stopped, or (a quiet machine) done at its 2048 tokens before the click arrived: the page's Stop reaches
            # the kernel either way (no cursor left); that Stop cancels a reply is held in tests/test_playground.py.
            ended = {(r["prompt"], r["finish_reason"]) for r in map(json.loads, latest[-2:])}
            assert ended <= {(PROMPT, "cancelled"), (PROMPT, "length")}, ended
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "chat-playground-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
