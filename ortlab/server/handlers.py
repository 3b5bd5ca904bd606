"""The REST routes under `<base_url>/ortlab/api`: a thin adapter over `ortlab.runner` and `ortlab.spec`.

Every route is an `APIHandler` method behind `@tornado.web.authenticated` (jupyter_server's token or login
cookie; an API request without one is answered 403) and `@authorized` (the server's authorizer, resource
"ortlab"). jupyter_server checks XSRF on every POST that is not token-authenticated, so a page on another site
cannot make a logged-in browser start or stop runs.

Run ids come from URLs: each goes through `naming.run_folder`, which refuses `..`, absolute paths, odd characters
and symbolic links out of the runs root; anything that is not a run folder there is a 404. Disk reads and
launch/resume (`ortlab.server.actions`) run in the executor, so no request holds the event loop.

An `OrtlabError` a route lets escape is the user's to read: it answers 4xx JSON with its message (`error_status`).
Anything else is a bug: 500 "Unhandled error", its traceback in the server's log only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.ioloop import IOLoop

from ortlab import safeio
from ortlab._version import __version__
from ortlab.errors import OrtlabError
from ortlab.runfolder.naming import run_folder
from ortlab.runfolder.records import record_schema
from ortlab.runfolder.rundir import DAMAGED, RESUMABLE, RunDir, RunStateError
from ortlab.runner import RunError
from ortlab.safeio import ascii_int
from ortlab.server.actions import estimate_in, launch_in, resume_in
from ortlab.server.runindex import metrics_since, parse_max_points
from ortlab.spec import SpecError
from ortlab.specfields import form

T = TypeVar("T")

API = "ortlab/api"
# A request body ortlab reads (a run spec) is a few KiB; one larger than this is refused unread.
MAX_BODY_BYTES = 2**20
ID = r"(?P<run_id>[^/]+)"


def error_status(e: OrtlabError) -> int:
    """409 when a run's state or its folder forbids what was asked (as the routes answer such requests
    themselves), 400 for everything else the user can fix (a spec, data, a path)."""

    return 409 if isinstance(e, (RunError, RunStateError, safeio.UnsafePath)) else 400


class OrtlabHandler(APIHandler):
    """Shared plumbing: the extension's state, JSON replies, run ids confined to the runs root."""

    auth_resource = "ortlab"

    @property
    def ortlab(self) -> Any:
        return self.settings["ortlab"]

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking (disk) call in the executor: a slow disk or a big folder never stalls other requests."""
        return await IOLoop.current().run_in_executor(None, fn, *args)

    def reply(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.finish(safeio.dumps(body))  # always valid JSON: a NaN from a run folder is null, not `NaN`

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """An OrtlabError that escaped a route: 4xx with its message (and its problems, one per line, as a bad
        spec's are); anything else is jupyter_server's JSON 500, which says no more than "Unhandled error"."""
        e = kwargs.get("exc_info", (None, None, None))[1]
        if not isinstance(e, OrtlabError):
            return super().write_error(status_code, **kwargs)
        problems = [str(p) for p in getattr(e, "problems", None) or []]
        message = str(e).splitlines()[0].rstrip(":") if problems else str(e)
        self.reply(error_status(e), {"message": message, "problems": problems})

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        """An OrtlabError is a warning line (the user's error, answered 4xx), not an error with a traceback."""
        if isinstance(value, OrtlabError):
            self.log.warning("%s %s %s: %s", error_status(value), self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)

    def run_dir(self, run_id: str) -> RunDir:
        """The run folder for `run_id`, or 404: an id that is not a safe name inside the root, or not a run."""
        root = self.ortlab.root
        try:
            path = run_folder(root, run_id)
        except ValueError:
            raise web.HTTPError(404, f"no run {run_id!r}: a run id is a folder name inside the runs root") from None
        if not os.path.lexists(path / "status.json"):  # a linked or odd status.json is a (damaged) run
            raise web.HTTPError(404, f"no run {run_id!r} under the runs root {str(root)!r}")
        return RunDir(path)

    async def json_body(self) -> Any:
        """The request's JSON body: 413 past MAX_BODY_BYTES (before parsing), 400 if it is not JSON. Parsed in the
        executor: a large or deeply nested document must not hold the event loop, which serves every other request."""
        body = self.request.body or b"null"
        if len(body) > MAX_BODY_BYTES:
            raise web.HTTPError(
                413,
                f"the request body is {len(body)} bytes; ortlab accepts at most {MAX_BODY_BYTES} "
                "(a run spec is a few KiB: send the spec's fields, not data)",
            )
        try:
            return await self.io(json.loads, body)
        except (ValueError, RecursionError) as e:
            raise web.HTTPError(400, f"the request body is not JSON: {e}") from None


class RunsHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every run under the root, newest first; `version` lets the sidebar check it talks to its own server."""

        rows = await self.io(self.ortlab.index.rows)
        self.reply(200, {"root": str(self.ortlab.root), "version": __version__, "runs": rows})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Launch a RunSpec (JSON body) in the runs root: 201 with the new run's id, or 400 with the problems."""

        data = await self.json_body()
        if not isinstance(data, dict):
            problems = [f"a run spec is a JSON object of fields (got {type(data).__name__})"]
            return self.reply(400, {"message": "invalid run spec", "problems": problems})
        # Runs go to the server's runs root, whatever the spec says: a request cannot choose where to write.
        spec = {**data, "output_dir": str(self.ortlab.root)}
        try:
            # The spec's own rules, then its target's doctor (cached; no torch in the server), then the start.
            answer = await self.io(launch_in, self.ortlab.root, spec, self.ortlab.cwd)
        except SpecError as e:
            return self.reply(400, {"message": "invalid run spec", "problems": e.problems})
        except RunError as e:
            return self.reply(400, {"message": str(e), "problems": [str(e)]})
        self.reply(201, {"id": answer["id"], "path": answer["path"]})


class RunHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        """One run: its row, plus status.json, the spec as run, and result.json once completed."""
        run = self.run_dir(run_id)
        self.reply(200, await self.io(self.ortlab.index.detail, run))


class MetricsHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        """Metrics records after byte `offset` (complete lines only) and the offset to ask from next; at most
        `max_points` step records (downsampled past it, keeping each bucket's extremes; bounded by default)."""
        run = self.run_dir(run_id)
        # Unstripped (tornado strips by default): the value checked is the value sent, so ' 3' is refused as '²' is.
        raw = self.get_argument("offset", "0", strip=False)
        offset = ascii_int(raw)
        if offset is None:
            raise web.HTTPError(400, f"offset must be a byte offset (an integer >= 0, ASCII digits), got {raw[:40]!r}")
        try:
            max_points = parse_max_points(self.get_argument("max_points", None, strip=False))
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        try:
            self.reply(200, await self.io(metrics_since, run, offset, max_points))
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None


class StopHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def post(self, run_id: str) -> None:
        """Ask for a graceful stop (the run finishes its step, saves a checkpoint, ends `stopped`): 202 at once."""
        run = self.run_dir(run_id)
        status = await self.io(run.status)
        if status["state"] == DAMAGED:
            raise web.HTTPError(409, f"run {run.id} is damaged, so it is not stopped: {status[DAMAGED]}")
        if status["state"] not in ("pending", "running"):
            raise web.HTTPError(409, f"run {run.id} is {status['state']}: only a pending or running run can stop")
        try:
            await self.io(run.request_stop)
        except OSError as e:  # control/ is a link: nothing is written through it
            raise web.HTTPError(409, f"run {run.id} is damaged, so it is not stopped: {e}") from None
        self.reply(202, {"id": run.id, "state": status["state"], "stop_requested": True})


class ResumeHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def post(self, run_id: str) -> None:
        """Continue a stopped or failed run from its last checkpoint in a new process: 202, or 409 if it cannot."""

        run = self.run_dir(run_id)
        status = await self.io(run.status)
        if status["state"] == DAMAGED:
            raise web.HTTPError(409, f"run {run.id} is damaged, so it does not resume: {status[DAMAGED]}")
        if status["state"] not in RESUMABLE:
            raise web.HTTPError(409, f"run {run.id} is {status['state']}: only a stopped or failed run can resume")
        try:
            answer = await self.io(resume_in, self.ortlab.root, run.id, self.ortlab.cwd)
        except (RunError, SpecError) as e:
            raise web.HTTPError(409, str(e)) from None
        self.reply(202, {"id": answer["id"], "state": answer["state"]})


class DoctorHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """What this environment can run, from the doctor's cache only: never waits for a probe."""
        self.reply(200, await self.io(doctor_summary))


class SpecHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """RunSpec's JSON schema and defaults: the sidebar's New run form builds its choices (every task),
        defaults and tooltips from them, so the form never lags the spec. `records`: what each metrics record
        holds and which fields are drawn (`ortlab.runfolder.records`), for the sidebar's reading of a run."""

        self.reply(200, {**await self.io(form), "records": record_schema()})


class EstimateHandler(OrtlabHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        """The estimate of a RunSpec before Launch (`ortlab.estimator`: memory, time, cost; about a second, no
        weights): body {"spec": {...}, "device": optional GPU name, "price_per_hour": optional}. 400 with the
        problems of a spec that does not parse, or why it cannot be estimated."""

        data = await self.json_body()
        if not isinstance(data, dict) or not isinstance(data.get("spec", {}), dict):
            problems = ['an estimate request is a JSON object: {"spec": {...}, "device": ..., "price_per_hour": ...}']
            return self.reply(400, {"message": "invalid estimate request", "problems": problems})
        args = (data.get("spec", {}), data.get("device"), data.get("price_per_hour"), self.ortlab.cwd)
        try:
            answer = await self.io(estimate_in, *args)
        except SpecError as e:
            return self.reply(400, {"message": "invalid run spec", "problems": e.problems})
        self.reply(200, answer)


def doctor_summary() -> dict[str, Any]:
    from ortlab.probe import cached_report

    report = cached_report()
    if report is None:
        return {
            "probed": False,
            "accelerations": {},
            "remedy": "run `ortlab doctor` once (about a minute); its report is cached for this environment",
        }
    keys = ("available", "reason", "remedy", "slow")
    return {
        "probed": True,
        "probed_at": report.probed_at,
        "python": report.python,
        "torch": report.torch,
        "accelerations": {name: {k: getattr(a, k) for k in keys} for name, a in report.accelerations.items()},
    }


def handlers() -> list[tuple[str, type[OrtlabHandler]]]:
    """The routes, relative to the server's base_url."""
    return [
        (f"{API}/runs", RunsHandler),
        (f"{API}/runs/{ID}", RunHandler),
        (f"{API}/runs/{ID}/metrics", MetricsHandler),
        (f"{API}/runs/{ID}/stop", StopHandler),
        (f"{API}/runs/{ID}/resume", ResumeHandler),
        (f"{API}/doctor", DoctorHandler),
        (f"{API}/spec", SpecHandler),
        (f"{API}/estimate", EstimateHandler),
    ]
