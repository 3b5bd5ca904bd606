"""The OpenAI-compatible HTTP face of one `Engine`: `GET /v1/models` and `POST /v1/chat/completions` (whole, or
streamed as server-sent events: `data: {chunk}` lines ending with `data: [DONE]`), as OpenAI's API defines them, so
the `openai` client and the tools built on it (LangChain, editors' assistants, evaluation harnesses) talk to a run.

Starlette routes and parses, uvicorn speaks HTTP: nothing here reads a socket. What this module adds is the guard:

- every route needs `Authorization: Bearer <token>` (compared in constant time), else 401;
- a body is at most MAX_BODY bytes (413), JSON, with `messages` a list of at most MAX_MESSAGES {role, content} turns
  (roles system/user/assistant, content text), `max_tokens` at most `engine.MAX_NEW_TOKENS`; anything else is 400
  with OpenAI's error shape ({"error": {"message", "type", "param", "code"}});
- one generation at a time per model (a lock: a CPU has no spare cores for two), the others wait their turn;
- a client that hangs up stops its generation before the next token (the stop event, set in `finally`).

The listener's address is not decided here: `ortlab.serve.__main__` binds 127.0.0.1 only.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import uuid
from typing import Any

from ortlab.errors import OrtlabError
from ortlab.serve.engine import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS, Engine, EngineError, Settings

MAX_BODY = 1 << 20  # 1 MiB of JSON: a long conversation fits, a flood does not
MAX_MESSAGES = 256
CHAT_ROLES = ("system", "user", "assistant")


class RequestError(OrtlabError, ValueError):
    """A request the endpoint refuses: its message, the field it names (OpenAI's `param`) and the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def _error(message: str, status: int, kind: str = "invalid_request_error", param: str | None = None) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def parse_request(body: Any, model_id: str) -> tuple[list[dict[str, str]], Settings, bool]:
    """(messages, settings, stream) from a chat completion request, or RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("model") not in (None, model_id):
        raise RequestError(f"this server serves the model {model_id!r}, not {body.get('model')!r}", "model", 404)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    if len(raw) > MAX_MESSAGES:
        raise RequestError(f"at most {MAX_MESSAGES} messages (got {len(raw)})", "messages")
    messages = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict) or turn.get("role") not in CHAT_ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}", f"messages[{i}].role")
        content = turn.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text parts only
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise RequestError("only text content parts are supported", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be text", f"messages[{i}].content")
        messages.append({"role": turn["role"], "content": content})
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = DEFAULT_MAX_NEW_TOKENS if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
        raise RequestError(f"max_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}", "max_tokens")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a string or a list of at most 4 non-empty strings", "stop")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported", "n")
    numbers = {}
    for field, default in (("temperature", 1.0), ("top_p", 1.0)):
        value = body.get(field)
        value = default if value is None else value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RequestError(f"{field} must be a number", field)
        numbers[field] = float(value)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError("seed must be a whole number", "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", "stream")
    try:
        settings = Settings(max_new_tokens=max_tokens, seed=seed, stop=tuple(stop), **numbers)
    except EngineError as e:
        raise RequestError(str(e)) from None
    return messages, settings, stream


def build_app(engine: Engine, token: str) -> Any:
    """The Starlette app serving `engine`; every request must carry `token`."""
    import anyio
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    expected = f"Bearer {token}".encode()
    turn = anyio.Lock()  # one generation at a time
    created = int(time.time())

    class Guard:
        """Pure ASGI middleware: the token, then the body size (announced, then counted as it arrives)."""

        def __init__(self, app: Any):
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return await self.app(scope, receive, send)
            headers = dict(scope.get("headers") or [])
            if not hmac.compare_digest(headers.get(b"authorization", b""), expected):
                response = _error(
                    "a bearer token is required (Authorization: Bearer <token>)", 401, "authentication_error"
                )
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
            length = headers.get(b"content-length", b"0")
            if not length.isdigit() or int(length) > MAX_BODY:
                return await _error(f"the request body is over {MAX_BODY} bytes", 413)(scope, receive, send)
            seen = 0

            async def counted() -> Any:
                nonlocal seen
                message = await receive()
                seen += len(message.get("body", b""))
                if seen > MAX_BODY:
                    raise RequestError(f"the request body is over {MAX_BODY} bytes", status=413)
                return message

            try:
                await self.app(scope, counted, send)
            except RequestError as e:
                await _error(str(e), e.status)(scope, receive, send)

    async def models(_request: Request) -> Any:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": engine.model_id, "object": "model", "created": created, "owned_by": "ortlab"}],
            }
        )

    async def completions(request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not JSON", 400)
        try:
            messages, settings, stream = parse_request(body, engine.model_id)
        except RequestError as e:
            return _error(str(e), e.status, param=e.param)
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        stop = threading.Event()
        try:  # the template and the length are checked before anything is sent: a refusal is a 400, not a cut stream
            generation = engine.generate(messages, settings, stop)
        except EngineError as e:
            return _error(str(e), 400, param="messages")
        if stream:
            return StreamingResponse(_events(ident, generation), media_type="text/event-stream")
        try:
            async with turn:
                await anyio.to_thread.run_sync(lambda: list(generation))
        finally:
            stop.set()
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": engine.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": generation.text},
                        "finish_reason": generation.finish_reason,
                    }
                ],
                "usage": _usage(generation),
            }
        )

    async def _events(ident: str, generation: Any) -> Any:
        def chunk(delta: dict, finish: str | None = None) -> str:
            body = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": engine.model_id,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(body)}\n\n"

        try:
            async with turn:
                pieces = iter(generation)
                yield chunk({"role": "assistant", "content": ""})
                while (piece := await anyio.to_thread.run_sync(next, pieces, None)) is not None:
                    yield chunk({"content": piece})
                yield chunk({}, generation.finish_reason)
                yield "data: [DONE]\n\n"
        finally:
            generation.stop.set()  # the client hung up (cancelled here), or the reply is complete: no more tokens

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", completions, methods=["POST"])],
        middleware=[Middleware(Guard)],
    )


def _usage(generation: Any) -> dict[str, int]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }
