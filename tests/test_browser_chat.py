"""The chat playground (`run.chat()`) in a real browser: JupyterLab (a real jupyter_server and kernel) driven by
Debian's chromium. A prompt typed in the page goes to the LoRA run's model and to its base model; both panes stream
(the reply grows while its cursor shows); a second cell runs and finishes while both still answer (the kernel is
free); Stop in the page ends both, and the exchange is in the run folder. A screenshot is kept in test-artifacts/.

The tiny model writes its 2048 tokens in about 3 s on a quiet CPU, less than the page's round trips take, so whether a
reply is still going when the test looks would depend on the machine. The servers therefore run paced (`paced_python`:
the real server and model, a sleep after each token, through the playground's own `python=`), so that a reply lasts
at least 40 s on any machine and every check below is about the playground, not about the machine's speed.
"""

from __future__ import annotations

import json
import sys
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


PACE_S = 0.02  # per token: 2048 tokens take at least 41 s (a 135M model's pace on a laptop CPU)


def paced_python(folder: Path) -> Path:
    """An interpreter for the chat servers: this Python with a sitecustomize that sleeps PACE_S after each token the
    PyTorch backend makes (nothing else changes: the same server, model, tokens and Stop)."""
    site = folder / "paced-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time\n"
        "from ortlab.serve import engine\n"
        "_stream = engine.TorchBackend.stream\n"
        "def stream(self, ids, settings, stop):\n"
        "    for token in _stream(self, ids, settings, stop):\n"
        f"        time.sleep({PACE_S})\n"
        "        yield token\n"
        "engine.TorchBackend.stream = stream\n"
    )
    wrapper = folder / "paced-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def jupyter_lab(tmp_path, chat_lora_run):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/dev setup (it installs Debian's chromium)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import ortlab\npg = ortlab.attach({str(chat_lora_run)!r}).chat(python={str(paced_python(tmp_path))!r})\n"
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
            # (this model opens with a hundred-odd newlines; the screenshot below waits for its first words)
            wait_until(lambda: all(t.split(PROMPT, 1)[1].strip(" ▍\n") for t in _panes(page)), 60, "words")
            # The kernel is free: the second cell runs and finishes while both models answer.
            page.locator(".jp-Cell").nth(1).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            wait_until(lambda: (folder / "alive.txt").exists(), 60, "the second cell to run")
            assert all("▍" in t for t in _panes(page)), "both still answering when the other cell ran"
            # Each pane follows its reply: the newest text is in view, the header scrolled away above it.
            seen = page.evaluate(
                """() => [...document.querySelectorAll('.ortlab-chat-pane')].map(p => {
                    const box = p.getBoundingClientRect(), turns = p.querySelectorAll('.widget-html-content > div');
                    const last = turns[turns.length - 1].getBoundingClientRect();
                    return [last.bottom <= box.bottom + 1 && last.bottom >= box.top, p.scrollHeight > p.clientHeight];
                })"""
            )
            assert seen == [[True, True], [True, True]], seen
            page.screenshot(path=str(ARTIFACTS / "chat-playground.png"), full_page=True)
            page.locator("button.ortlab-chat-stop").click()
            wait_until(lambda: all("▍" not in t for t in _panes(page)), 30, "Stop to end both replies")
            # Stop, once more with nothing in between: asked again, stopped as soon as both stream.
            page.get_by_role("button", name="New chat").click()
            page.locator(".ortlab-chat-prompt textarea").fill(PROMPT)
            page.locator("button.ortlab-chat-send").click()
            wait_until(lambda: all("▍" in t for t in _panes(page)), 60, "both replies again")
            page.locator("button.ortlab-chat-stop").click()
            wait_until(lambda: all("▍" not in t for t in _panes(page)), 30, "Stop to end both replies")
            records = wait_until(lambda: list((run / "chats").glob("*.jsonl")), 10, "the saved chats")
            lines = [json.loads(x) for f in records for x in f.read_text().splitlines()]
            # two exchanges, each model's reply a line, each ended by the page's Stop
            assert [(r["prompt"], r["finish_reason"]) for r in lines] == [(PROMPT, "cancelled")] * 4, lines
            assert_no_page_errors(errors)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "chat-playground-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
