"""`ortlab serve RUN`: a run's model behind an OpenAI-compatible endpoint on 127.0.0.1, opened by a bearer token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ortlab.cli.common import RootOption, reported, run_named


def serve(
    run_id: Annotated[str, typer.Argument(help="a completed causal-LM run (id or folder)")],
    root: RootOption = None,
    port: Annotated[int, typer.Option(help="the port on 127.0.0.1 (0: any free one)")] = 8000,
    base: Annotated[bool, typer.Option("--base", help="serve the model the run started from instead")] = False,
    onnx: Annotated[
        Path | None, typer.Option(help="serve the run's ONNX export with a KV cache in this folder (greedy)")
    ] = None,
) -> None:
    """Serve a run's model at http://127.0.0.1:PORT/v1 (OpenAI's chat completions, streamed or whole).

    Every request needs `Authorization: Bearer TOKEN`: the token is $ORTLAB_SERVE_TOKEN when set, else a fresh one,
    printed here. Only this machine can connect (the listener is on 127.0.0.1). Ctrl-C ends it."""
    from ortlab.serve.engine import Engine
    from ortlab.serve.listener import TOKEN_ENV, serve, token_from_env

    run = run_named(run_id, root)
    token, given = token_from_env()
    with reported():
        if base and onnx:
            raise typer.BadParameter("--base and --onnx name two models: pick one")
        typer.echo(f"loading {'the base model of ' if base else ''}run {run.id} ...", err=True)
        engine = Engine.for_run(run.dir, base=base, onnx=onnx)

        def announce(info: dict[str, Any]) -> None:
            shown = f"(from ${TOKEN_ENV})" if given else token
            typer.echo(
                f"serving {info['id']} ({info['backend']}) at {info['url']}\n"
                f"token: {shown}\n"
                f'try:   curl -N {info["url"]}/chat/completions -H "Authorization: Bearer $TOKEN" '
                "-H 'Content-Type: application/json' "
                f"""-d '{{"model": "{info["id"]}", "stream": true, "messages": '"""
                """[{"role": "user", "content": "Hi"}]}'\n"""
                f"or:    OpenAI(base_url='{info['url']}', api_key=TOKEN)  (the openai package)",
                err=False,
            )

        serve(engine, token, port, announce)
