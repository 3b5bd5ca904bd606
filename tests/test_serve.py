"""`ortlab serve` and its engine (ortlab.serve): a LoRA run's model answers as in training (greedy tokens equal to
`ortlab.chat.generate` on the merged model), streams, stops mid-reply; the endpoint speaks OpenAI's API to the real
`openai` client, on 127.0.0.1 only, and refuses a request without the token, an oversized body and bad fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest

from ortlab.serve.endpoint import MAX_BODY, RequestError, parse_request
from ortlab.serve.engine import MAX_NEW_TOKENS, EngineError, Settings, pick

pytestmark = pytest.mark.slow  # a LoRA run of the tiny chat Llama (session fixture), servers in child processes

ASK = [{"role": "user", "content": "Is review 3 fresh?"}]


# --- the engine --------------------------------------------------------------------------------------------------


def test_greedy_replies_are_the_trained_models_with_the_training_template(chat_lora_run):
    """The engine's greedy tokens are those of `ortlab.chat.generate` (what the run's generations used) on the model
    the run trained (the adapter merged onto its base), with the run's tokenizer and its chat template."""
    from ortlab.adapters import load_merged
    from ortlab.chat import generate
    from ortlab.serve.engine import Engine
    from ortlab.tasks import load_tokenizer

    engine = Engine.for_run(chat_lora_run)
    reply = engine.generate(ASK, Settings(temperature=0, max_new_tokens=12))
    text = "".join(reply)
    model = load_merged(str(chat_lora_run / "model"), "causal-lm")
    expected = generate(model, load_tokenizer(str(chat_lora_run / "model")), [ASK], max_new_tokens=12)
    assert text.strip() == expected[0]
    assert reply.completion_tokens >= 1 and reply.finish_reason in ("stop", "length")
    assert reply.prompt_tokens == len(engine.prompt_ids(ASK))
    rendered = engine.tokenizer.decode(engine.prompt_ids(ASK))
    assert rendered.endswith("<|im_start|>assistant\n")  # the template's generation prompt, as in training

    base = Engine.for_run(chat_lora_run, base=True)
    assert base.model_id == "chat-lora:base"
    trained = engine.backend.model.model.layers[0].self_attn.q_proj.weight
    assert not (base.backend.model.model.layers[0].self_attn.q_proj.weight == trained).all()  # LoRA changed it


def test_stop_ends_a_reply_between_tokens(chat_lora_run):
    from ortlab.serve.engine import Engine

    engine = Engine.for_run(chat_lora_run)
    stop = threading.Event()
    reply = engine.generate(ASK, Settings(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=0), stop)
    tokens = 0
    for tokens, _piece in enumerate(reply, 1):
        if tokens == 3:
            stop.set()
    assert reply.finish_reason == "cancelled", reply.finish_reason
    assert reply.completion_tokens < 10  # the backend checks the event before each forward


def test_stop_strings_cut_the_reply_and_are_not_shown(chat_lora_run):
    from ortlab.serve.engine import Engine

    engine = Engine.for_run(chat_lora_run)
    full = engine.generate(ASK, Settings(temperature=0, max_new_tokens=24))
    text = "".join(full)
    assert len(text) > 4, text
    stop = text[2:4]
    cut = engine.generate(ASK, Settings(temperature=0, max_new_tokens=24, stop=(stop,)))
    assert "".join(cut) == text[: text.find(stop)] and cut.finish_reason == "stop"


def test_a_conversation_that_cannot_fit_the_model_is_refused_before_a_token(chat_lora_run):
    from ortlab.serve.engine import Engine

    engine = Engine.for_run(chat_lora_run)
    assert engine.backend.context == 4096
    long = [{"role": "user", "content": "fresh rotten " * 400}]
    assert len(engine.prompt_ids(long)) + MAX_NEW_TOKENS > 4096
    with pytest.raises(EngineError, match="exceed the model's 4096 positions"):
        engine.generate(long, Settings(max_new_tokens=MAX_NEW_TOKENS))
    assert engine.generate(long, Settings(max_new_tokens=8)).prompt_tokens < 4096 - 8  # fewer tokens: it fits


def test_sampling_rules():
    import torch

    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert pick(logits, 0.0, 1.0) == 1  # greedy
    gen = torch.Generator().manual_seed(0)
    assert {pick(logits, 1.0, 0.01, gen) for _ in range(50)} == {1}  # the nucleus keeps the top token only
    drawn = {pick(logits, 1.0, 0.9, gen) for _ in range(200)}
    assert drawn == {1, 2}, drawn  # tokens 1 and 2 hold ~0.9 of the mass together; 0 and 3 are cut
    with pytest.raises(EngineError, match="temperature"):
        Settings(temperature=3)
    with pytest.raises(EngineError, match="max_new_tokens"):
        Settings(max_new_tokens=MAX_NEW_TOKENS + 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"messages": ASK, "max_tokens": MAX_NEW_TOKENS + 1}, "max_tokens"),
        ({"messages": ASK, "max_tokens": True}, "max_tokens"),
        ({"messages": ASK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": ASK, "stream": "yes"}, "stream"),
        ({"messages": ASK, "n": 2}, "n"),
        ({"messages": ASK, "temperature": "hot"}, "temperature"),
        ({"messages": ASK, "model": "gpt-4"}, "model"),
        ({"messages": [ASK[0]] * 300}, "messages"),
    ],
)
def test_bad_requests_are_named_by_their_field(body, param):
    with pytest.raises(RequestError) as info:
        parse_request(body, "chat-lora")
    assert info.value.param == param


def test_a_good_request_parses():
    messages, settings, stream = parse_request(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": True,
         "max_tokens": 7, "temperature": 0, "stop": "\n"}, "m")  # fmt: skip
    assert messages == [{"role": "user", "content": "hi"}] and stream
    assert settings == Settings(temperature=0.0, top_p=1.0, max_new_tokens=7, stop=("\n",))


# --- the endpoint, in its own process ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(chat_lora_run):
    """`ortlab serve chat-lora --port 0` with the token from $ORTLAB_SERVE_TOKEN: (url, token, process)."""
    token = "test-token-" + os.urandom(8).hex()
    env = {**os.environ, "ORTLAB_SERVE_TOKEN": token}
    cmd = [sys.executable, "-m", "ortlab.cli", "serve", "chat-lora", "--root", str(chat_lora_run.parent), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    url = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("serving "):
            url = line.split(" at ")[1].strip()
        if line.startswith("token:"):
            assert token not in line and "ORTLAB_SERVE_TOKEN" in line  # a given token is never printed
            break
    assert url, lines
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    yield url, token, proc
    proc.terminate()
    proc.wait(20)


def _post(url: str, body: bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_listener_is_on_loopback_only(server):
    from listening import beyond_loopback, listening

    url, _token, proc = server
    found = listening(proc.pid)
    assert found and [port for _n, _ip, port in found] == [int(url.split(":")[2].split("/")[0])]
    assert beyond_loopback(found) == []


def test_no_token_or_a_wrong_one_is_401(server):
    url, token, _proc = server
    body = json.dumps({"messages": ASK}).encode()
    for wrong in (None, "nope", token + "x"):
        status, answer = _post(f"{url}/chat/completions", body, wrong)
        assert status == 401 and answer["error"]["type"] == "authentication_error", (wrong, answer)
    request = urllib.request.Request(f"{url}/models")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 401


def test_invalid_requests_are_refused_with_openais_error_shape(server):
    url, token, _proc = server
    status, answer = _post(f"{url}/chat/completions", b"not json", token)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    body = json.dumps({"messages": ASK, "max_tokens": MAX_NEW_TOKENS + 1}).encode()
    status, answer = _post(f"{url}/chat/completions", body, token)
    assert status == 400 and answer["error"]["param"] == "max_tokens"


def test_an_oversized_body_is_refused_announced_or_not():
    """Over MAX_BODY bytes: refused from its Content-Length before it is read, and, sent in chunks without one,
    once the bytes read pass the limit (the app never sees the whole body)."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from ortlab.serve.endpoint import build_app

    client = TestClient(build_app(SimpleNamespace(model_id="m"), "t"))
    auth = {"Authorization": "Bearer t"}
    big = b"{" + b" " * MAX_BODY + b"}"
    assert client.post("/v1/chat/completions", content=big, headers=auth).status_code == 413
    chunks = iter([big[: MAX_BODY // 2], big[MAX_BODY // 2 :]])
    assert client.post("/v1/chat/completions", content=chunks, headers=auth).status_code == 413
    assert client.post("/v1/chat/completions", content=b"{}", headers={"Authorization": "Bearer x"}).status_code == 401
    assert client.post("/v1/chat/completions", content=b"{}", headers=auth).status_code == 400  # under the limit


def test_the_openai_client_gets_a_streamed_and_a_whole_completion(server):
    from openaisite import openai_site

    url, token, _proc = server
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.append({str(openai_site())!r})
        from openai import OpenAI
        client = OpenAI(base_url={url!r}, api_key={token!r}, max_retries=0)
        models = [m.id for m in client.models.list()]
        chunks = []
        for chunk in client.chat.completions.create(model="chat-lora", messages={ASK!r}, stream=True, max_tokens=16,
                                                    temperature=0):
            chunks.append([chunk.choices[0].delta.content, chunk.choices[0].finish_reason])
        whole = client.chat.completions.create(model="chat-lora", messages={ASK!r}, max_tokens=16, temperature=0)
        print(json.dumps({{"models": models, "chunks": chunks, "whole": whole.choices[0].message.content,
                           "usage": whole.usage.completion_tokens, "finish": whole.choices[0].finish_reason}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["models"] == ["chat-lora"]
    pieces = [c for c, _f in got["chunks"] if c]
    assert len(pieces) >= 2, got["chunks"]  # streamed: several content chunks, then one with the finish reason
    assert got["chunks"][-1][1] in ("stop", "length")
    assert "".join(pieces) == got["whole"]  # greedy: the same reply streamed or whole
    assert 1 <= got["usage"] <= 16


def test_a_client_that_hangs_up_frees_the_model(server):
    """A stream cut after its first chunk: the next request is answered at once, not after the abandoned reply's
    2048 tokens (one generation at a time, so the abandoned one would hold the model)."""
    import http.client

    url, token, _proc = server
    port = int(url.split(":")[2].split("/")[0])
    body = {"messages": ASK, "stream": True, "max_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "seed": 1}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    conn.close()
    start = time.monotonic()
    status, answer = _post(f"{url}/chat/completions", json.dumps({"messages": ASK, "max_tokens": 4}).encode(), token)
    assert status == 200 and answer["usage"]["completion_tokens"] <= 4
    # A whole 2048-token reply of this model takes well over 10 s on this machine; the hang-up stopped it.
    assert time.monotonic() - start < 10


def test_only_a_completed_causal_lm_run_can_chat(tmp_path):
    from fake_runs import make_fake_run

    from ortlab.serve.engine import Engine

    stopped = make_fake_run(tmp_path, "halfway", state="stopped")
    with pytest.raises(EngineError, match="is stopped: only a completed run"):
        Engine.for_run(stopped)
    classifier = make_fake_run(tmp_path, "classifier")  # completed, a sequence classifier with a model folder
    (classifier / "model").mkdir()
    (classifier / "model" / "config.json").write_text("{}")
    with pytest.raises(EngineError, match="chat needs a causal LM"):
        Engine.for_run(classifier)


def test_an_onnx_generator_plugs_in_as_a_backend(chat_lora_run, tmp_path, monkeypatch):
    """The seam for the ONNX export with a KV cache: any `OnnxGenerator(folder).stream(ids, max_new_tokens)` in
    ortlab.export answers through the same engine (template, decoding, end of turn) as the PyTorch model."""
    import ortlab.export
    from ortlab.serve.engine import Engine
    from ortlab.tasks import load_tokenizer

    tokenizer = load_tokenizer(str(chat_lora_run / "model"))
    said = tokenizer("fresh, really", add_special_tokens=False)["input_ids"]
    asked = []

    class FakeGenerator:
        def __init__(self, folder):
            asked.append(folder)

        def stream(self, ids, max_new_tokens, **settings):
            asked.append((list(ids), max_new_tokens, settings))
            yield from [*said, tokenizer.convert_tokens_to_ids("<|im_end|>"), *said]

    monkeypatch.delattr(ortlab.export, "OnnxGenerator", raising=False)
    with pytest.raises(EngineError, match="no ONNX generator"):
        Engine.for_run(chat_lora_run, onnx=tmp_path)
    monkeypatch.setattr(ortlab.export, "OnnxGenerator", FakeGenerator, raising=False)
    engine = Engine.for_run(chat_lora_run, onnx=tmp_path)
    reply = engine.generate(ASK, Settings(max_new_tokens=9))
    assert "".join(reply) == "fresh, really" and reply.finish_reason == "stop"  # ends at <|im_end|>
    assert engine.model_id == "chat-lora:onnx" and engine.describe()["backend"] == "onnx"
    sampling = {"temperature": 0.7, "top_p": 0.9, "seed": None}  # the settings reach the generator
    assert asked == [tmp_path, (engine.prompt_ids(ASK), 9, sampling)]


@pytest.mark.slow
def test_the_onnx_export_answers_as_the_pytorch_model_does(chat_lora_run, tmp_path):
    """The real seam: the run exported to ONNX with a KV cache (`ortlab.export.OnnxGenerator`) gives, greedy, the
    same reply through the engine as the PyTorch model it was exported from; the settings reach it (sampling)."""
    import shutil

    from ortlab.export import export_onnx
    from ortlab.serve.engine import Engine

    run = shutil.copytree(chat_lora_run, tmp_path / "chat-lora")  # the export writes into the run folder
    report = export_onnx(run, samples=4, batch_sizes=(1,))
    assert report.variants["fp32"].good, report
    torch_engine, onnx_engine = Engine.for_run(run), Engine.for_run(run, onnx=run / "onnx")
    greedy = Settings(temperature=0.0, max_new_tokens=12)
    expected = torch_engine.generate(ASK, greedy)
    said = "".join(onnx_engine.generate(ASK, greedy))
    assert said == "".join(expected) and said, (said, expected)
    sampled = Settings(temperature=1.0, top_p=0.9, seed=3, max_new_tokens=12)
    first, again = ("".join(onnx_engine.generate(ASK, sampled)) for _ in range(2))
    assert first == again, "a seed makes the ONNX backend's sampling repeatable"
    assert onnx_engine.describe() == {"id": "chat-lora:onnx", "backend": "onnx", "sampling": True}
