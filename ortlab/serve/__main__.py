"""`python -m ortlab.serve FOLDER [--base | --onnx DIR] [--port N] [--parent PID]`: the server the playground starts
(one JSON line on stdout when it listens; the token comes from $ORTLAB_SERVE_TOKEN). People use `ortlab serve`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ortlab.serve")
    parser.add_argument("run", help="run folder")
    parser.add_argument("--base", action="store_true", help="the model the run started from")
    parser.add_argument("--onnx", default=None, help="the run's ONNX export (KV cache) in this folder")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent", type=int, default=None, help="end when this process ends")
    args = parser.parse_args(argv)

    from ortlab.errors import OrtlabError
    from ortlab.serve.engine import Engine
    from ortlab.serve.listener import TOKEN_ENV, announce_json, serve, token_from_env

    token, given = token_from_env()
    if not given:
        print(f"error: set ${TOKEN_ENV}: this entry point never prints a token", file=sys.stderr)
        return 2
    try:
        engine = Engine.for_run(args.run, base=args.base, onnx=args.onnx)
        serve(engine, token, args.port, announce_json, parent=args.parent)
    except (OrtlabError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
