"""Launch and resume for the server, done in a short-lived helper process.

Why a helper: checking a RunSpec's acceleration mix against this machine asks torch (is CUDA there, does the
fused AdamW exist), and importing torch takes seconds and hundreds of MB. The Jupyter server must stay light
and its event loop free, so the server checks what it can without torch (the fields: `RunSpec.parse(...,
stored=True)`), then runs `python -m ortlab.server.actions launch ROOT` with the spec on stdin. The helper does
exactly what `ortlab.launch` does everywhere else (the same validation, the same run folder, the same worker in
its own session, so the run outlives the helper), prints one JSON line and exits.

    launch ROOT        stdin: the spec (JSON)  ->  {"id", "path"} | {"problems": [...]} | {"error": "..."}
    resume ROOT ID                             ->  {"id", "state"} | {"refused": "..."}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError

# A launch may check another interpreter (`target.python`: up to 120 s in `ortlab.runner.check_runtime`).
HELPER_TIMEOUT_S = 300.0


class HelperFailed(OrtlabError, RuntimeError):
    """The helper process crashed or timed out: the message has the end of its output."""


async def run_helper(args: list[str], stdin: dict[str, Any] | None, cwd: str | os.PathLike) -> dict[str, Any]:
    """Run `python -m ortlab.server.actions ARGS` without blocking the event loop; its JSON answer.

    `cwd` is the Jupyter server's root folder: relative data and model paths in a spec mean what they mean in
    the file browser, and the run process starts there (as `ortlab.launch` starts it in the caller's folder).
    """
    from ortlab.envvars import child_env

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ortlab.server.actions",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(cwd),
        env=child_env(),
    )
    data = json.dumps(stdin).encode() if stdin is not None else b""
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout=HELPER_TIMEOUT_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise HelperFailed(f"ortlab's launch helper did not answer within {HELPER_TIMEOUT_S:.0f} s") from None
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if proc.returncode != 0 or not isinstance(answer, dict):
        tail = err.decode(errors="replace").strip()[-2000:] or "no output"
        raise HelperFailed(f"ortlab's launch helper failed (exit {proc.returncode}): {tail}")
    return answer


def _launch(root: str, spec: dict[str, Any]) -> dict[str, Any]:
    from ortlab.runner import launch

    try:
        run = launch(spec, root=root)
    except OrtlabError as e:  # the user's to fix (answered 400): a spec's or a mix's problems, or what else is wrong
        problems = getattr(e, "problems", None)
        return {"problems": [str(p) for p in problems]} if problems else {"error": str(e)}
    return {"id": run.id, "path": str(run.path)}


def _resume(root: str, run_id: str) -> dict[str, Any]:
    from ortlab.runner import attach

    try:
        run = attach(run_id, root=root).resume()
    except OrtlabError as e:  # the run's state, its folder or its spec forbids it (answered 409)
        return {"refused": str(e)}
    return {"id": run.id, "state": run.dir.read_status().get("state")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = sys.stdout
    # Whatever the libraries print goes to stderr: stdout carries the one JSON answer.
    sys.stdout = sys.stderr
    if len(argv) == 2 and argv[0] == "launch":
        answer = _launch(str(Path(argv[1])), json.load(sys.stdin))
    elif len(argv) == 3 and argv[0] == "resume":
        answer = _resume(str(Path(argv[1])), argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
