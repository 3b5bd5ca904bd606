"""`run.chat()`: the notebook's chat playground (ortlab.ui.playground), driven through its widgets' models (no
browser): a LoRA run's model and its base model each answer in a child server; both replies stream into their panes
while the calling thread stays free; Stop ends both; what is shown is escaped; each exchange lands in the run folder
as JSON lines."""

from __future__ import annotations

import itertools
import json
import time

import pytest

pytestmark = pytest.mark.slow  # a LoRA run (session fixture) and two chat servers in child processes

PROMPT = "Is review 3 fresh?"


@pytest.fixture(scope="module")
def playground(chat_lora_run):
    from ortlab.runner import Run

    pg = Run(chat_lora_run).chat()
    assert all(side.ready.wait(300) for side in pg.sides)
    assert [side.error for side in pg.sides] == ["", ""]
    yield pg
    pg.close()


def _streamed(values: list[tuple[float, str]]) -> int:
    """How many times a pane showed a longer reply while it was still being written (the cursor ▍ on)."""
    lengths = [len(v) for _t, v in values if "▍" in v]
    return sum(1 for a, b in itertools.pairwise(lengths) if b > a)


def test_both_models_stream_stop_ends_both_and_the_calling_thread_stays_free(playground):
    from ortlab.serve.engine import MAX_NEW_TOKENS

    pg = playground
    assert [s.server.model_id for s in pg.sides] == ["chat-lora", "chat-lora:base"]
    pg.temperature.value, pg.max_new_tokens.value = 0.0, MAX_NEW_TOKENS  # greedy: this tiny model never ends a turn
    seen: dict[int, list[tuple[float, str]]] = {0: [], 1: []}
    for i, side in enumerate(pg.sides):
        side.pane.observe(lambda change, i=i: seen[i].append((time.monotonic(), change["new"])), names="value")
    pg.prompt.value = PROMPT
    start = time.monotonic()
    pg.send_button.click()
    assert time.monotonic() - start < 0.5  # Send only starts threads
    assert pg.busy and pg.send_button.disabled and not pg.stop_button.disabled
    # The calling thread (the kernel's, in a notebook) runs while both answer: 50 short sleeps keep their pace.
    ticks = [time.monotonic()]
    for _ in range(50):
        time.sleep(0.01)
        ticks.append(time.monotonic())
    assert max(b - a for a, b in itertools.pairwise(ticks)) < 0.3
    deadline = time.monotonic() + 120
    while min(_streamed(seen[0]), _streamed(seen[1])) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _streamed(seen[0]) >= 3 and _streamed(seen[1]) >= 3, (len(seen[0]), len(seen[1]))
    assert pg.busy  # still answering: 2048 tokens are far off
    pg.stop_button.click()
    assert pg.wait(30), "Stop did not end both replies"
    for side in pg.sides:
        assert side.finish_reason == "cancelled", side.finish_reason
        assert side.messages[-2:][0] == {"role": "user", "content": PROMPT}
        assert side.messages[-1]["role"] == "assistant" and side.messages[-1]["content"]  # what it said so far
        assert "▍" not in side.pane.value
    assert not pg.send_button.disabled and pg.stop_button.disabled
    records = [json.loads(line) for line in pg.saved.read_text().splitlines()]
    assert sorted(r["model"] for r in records[-2:]) == ["chat-lora", "chat-lora:base"]
    assert {r["finish_reason"] for r in records[-2:]} == {"cancelled"}
    assert all(r["settings"]["max_tokens"] == MAX_NEW_TOKENS for r in records[-2:])


def test_what_is_shown_is_escaped_and_each_exchange_is_saved_in_the_run_folder(playground, chat_lora_run):
    pg = playground
    pg.clear()
    pg.max_new_tokens.value, pg.temperature.value = 8, 0.7
    prompt = "<script>alert(1)</script> & <b>bold</b>"
    pg.send(prompt)
    assert pg.wait(120)
    for side in pg.sides:
        assert "<script>" not in side.pane.value and "<b>bold" not in side.pane.value
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in side.pane.value
        assert side.messages[0] == {"role": "user", "content": prompt}  # a new chat: this prompt first
        assert side.finish_reason in ("stop", "length")
    assert pg.saved.parent == chat_lora_run / "chats"
    records = [json.loads(line) for line in pg.saved.read_text().splitlines()]
    assert [r["prompt"] for r in records] == [prompt, prompt]  # the new chat's own file
    assert {r["side"] for r in records} == {0, 1} and all(r["settings"]["max_tokens"] == 8 for r in records)


def test_a_reply_is_escaped_in_its_pane(chat_lora_run):
    from ortlab.serve.chatproc import ChatServer
    from ortlab.ui.playground import Side

    side = Side("run <i>x</i>", ChatServer(chat_lora_run))
    side.ready.set()
    side.messages = [{"role": "assistant", "content": '<img src=x onerror="alert(1)">'}]
    side.error = "<svg onload=alert(2)>"
    side.render()
    assert "<img" not in side.pane.value and "<svg" not in side.pane.value and "<i>x" not in side.pane.value
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in side.pane.value


def test_close_ends_both_servers(playground):
    from ortlab.serve.chatproc import wait_gone

    processes = [side.server.process for side in playground.sides]
    assert all(p is not None and p.poll() is None for p in processes)
    playground.close()
    assert all(wait_gone(p, 20) for p in processes)
