"""The jupyter_server extension's REST API (`ortlab.server`), against a real Jupyter server in the test process.

jupyter_server's pytest plugin starts the server (`jp_serverapp`, with a token and a base_url of `/a%40b/`).
Its fixtures are imported into this module only, not registered as a plugin for the session: the plugin's
autouse fixtures (a fresh event loop per test) would otherwise run around every other test of the suite. The
tests are plain functions that drive the server's event loop with `run_until_complete`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, ROOT
from fake_runs import append, make_fake_run, step_record
from jupyter_server.utils import url_path_join
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures, for this module only: see the docstring)

import ortlab
from ortlab.accel import tcmalloc
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.records import record_schema
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import TASKS, HyperSpec, RunSpec
from ortlab.toggles import form_toggles

# Every route, with a run id that exists in the `runs` fixture (a running run).
ROUTES = [
    ("GET", "runs"),
    ("POST", "runs"),
    ("GET", "runs/live"),
    ("GET", "runs/live/metrics"),
    ("POST", "runs/live/stop"),
    ("POST", "runs/live/resume"),
    ("GET", "doctor"),
    ("GET", "spec"),
    ("POST", "estimate"),
]


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


@pytest.fixture
def jp_server_config(runs_root: Path) -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"ortlab": True}}, "Ortlab": {"runs_root": str(runs_root)}}


@pytest.fixture
def runs(runs_root: Path) -> dict[str, Path]:
    """Three runs: `done` (completed), `stopped`, and `live` (running, this process as its worker)."""
    return {
        "done": make_fake_run(runs_root, "done", "completed", steps=20),
        "stopped": make_fake_run(runs_root, "stopped", "stopped", steps=7),
        "live": make_fake_run(runs_root, "live", "running", steps=3),
    }


class Api:
    """Synchronous calls to the test server: `api("GET", "runs")` -> (status code, JSON body, response)."""

    def __init__(self, client: Any, loop: Any, base_url: str, auth: dict[str, str]):
        self.client, self.loop, self.base_url, self.auth = client, loop, base_url, auth

    def url(self, path: str) -> str:
        return url_path_join(self.base_url, "ortlab/api", path)

    def __call__(
        self, method: str, path: str, body: Any = None, token: bool = True, headers: dict | None = None
    ) -> tuple[int, Any, Any]:
        hdrs = {**(self.auth if token else {}), **(headers or {})}
        if body is None and method == "POST":
            body = b""
        elif body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        response = self.loop.run_until_complete(
            self.client.fetch(
                self.url(path), method=method, body=body, headers=hdrs, raise_error=False, request_timeout=330
            )
        )
        try:
            data = json.loads(response.body) if response.body else None
        except ValueError:
            data = response.body.decode(errors="replace")
        return response.code, data, response


@pytest.fixture
def api(jp_serverapp, http_server_client, jp_asyncio_loop, jp_base_url, jp_auth_header) -> Api:
    return Api(http_server_client, jp_asyncio_loop, jp_base_url, jp_auth_header)


# --- authentication and confinement ------------------------------------------------------------------------


def test_every_route_answers_with_the_token(api, runs, runs_root):
    code, body, _ = api("GET", "runs")
    assert code == 200, body
    assert body["root"] == str(runs_root.resolve())
    assert body["version"] == ortlab.__version__
    assert [r["id"] for r in body["runs"]] == ["live", "stopped", "done"], "newest first"

    code, body, _ = api("GET", "runs/done")
    assert code == 200, body
    assert body["state"] == "completed" and body["status"]["state"] == "completed"
    assert body["spec"]["name"] == "done" and body["spec"]["hyper"]["max_steps"] == 100
    assert body["result"]["summary"]["steps"] == 20

    code, body, _ = api("GET", "runs/done/metrics")
    assert code == 200, body
    assert [r["step"] for r in body["records"] if r["event"] == "step"] == list(range(1, 21))
    assert body["offset"] == runs["done"].joinpath("metrics.jsonl").stat().st_size

    code, body, _ = api("GET", "doctor")
    assert code == 200, body
    assert isinstance(body["probed"], bool) and isinstance(body["accelerations"], dict)

    code, body, _ = api("GET", "spec")
    assert code == 200 and body["schema"] == RunSpec.json_schema(), body
    assert body["defaults"] == RunSpec.parse({}).model_dump(mode="json")
    assert body["toggles"] == [t.to_dict() for t in form_toggles()], "the sidebar's toggles are the one list"
    assert body["records"] == record_schema(), "what a metrics record holds, as ortlab.runfolder.records says"
    step = next(r for r in body["records"] if r["event"] == "step")
    assert [f["name"] for f in step["fields"] if "sidebar" in f["drawn"]] == ["loss", "samples_per_s"]

    code, body, _ = api("POST", "runs/live/stop")
    assert (code, body) == (202, {"id": "live", "state": "running", "stop_requested": True})
    assert RunDir(runs["live"]).stop_requested()

    code, body, _ = api("POST", "runs/done/resume")
    assert code == 409 and "completed" in body["message"], body

    code, body, _ = api("POST", "runs", {"hyper": {"batch_size": 0}})
    assert code == 400 and body["problems"], body


def test_every_route_refuses_a_request_without_a_token(api, runs, runs_root):
    before = sorted(p.name for p in runs_root.iterdir())
    for method, path in ROUTES:
        body = {"name": "sneaky"} if (method, path) == ("POST", "runs") else None
        code, answer, _ = api(method, path, body, token=False)
        assert code in (401, 403), f"{method} {path} answered {code} without a token: {answer}"
        assert "live" not in json.dumps(answer or "") or method == "POST", "no run data without a token"
    assert sorted(p.name for p in runs_root.iterdir()) == before, "nothing launched"
    assert not RunDir(runs["live"]).stop_requested(), "nothing stopped"
    # A wrong token is no token.
    code, _, _ = api("GET", "runs", token=False, headers={"Authorization": "token not-the-token"})
    assert code in (401, 403)


def _login_cookie(api: Api) -> str:
    """The login cookie the server sets for a token-authenticated request: what a browser session carries."""
    _, _, response = api("GET", "runs")
    cookies = [c.split(";", 1)[0] for c in response.headers.get_list("Set-Cookie")]
    login = [c for c in cookies if c.startswith("username-")]
    assert login, f"no login cookie in {cookies}"
    return login[0]


def test_xsrf_is_enforced_on_post_for_cookie_sessions(api, runs):
    cookie = _login_cookie(api)
    live = RunDir(runs["live"])

    # The cookie alone authenticates GETs (a browser session) ...
    code, body, _ = api("GET", "runs", token=False, headers={"Cookie": cookie})
    assert code == 200, body
    # ... but a POST with the cookie and no XSRF token is what a page on another site could send: refused.
    for path in ("runs/live/stop", "runs/stopped/resume", "runs"):
        code, body, _ = api("POST", path, token=False, headers={"Cookie": cookie})
        assert code == 403, (path, code, body)
        assert "xsrf" in json.dumps(body).lower(), body
    assert not live.stop_requested()
    # A mismatched pair is refused too.
    headers = {"Cookie": f"{cookie}; _xsrf=aaaa", "X-XSRFToken": "bbbb"}
    code, _, _ = api("POST", "runs/live/stop", token=False, headers=headers)
    assert code == 403
    assert not live.stop_requested()
    # The pair JupyterLab sends (the _xsrf cookie echoed in the X-XSRFToken header) passes.
    headers = {"Cookie": f"{cookie}; _xsrf=abcd1234", "X-XSRFToken": "abcd1234"}
    code, body, _ = api("POST", "runs/live/stop", token=False, headers=headers)
    assert code == 202, body
    assert live.stop_requested()


@pytest.mark.parametrize(
    "run_id",
    [
        "nope",  # unknown
        "..",  # the parent folder
        "%2E%2E",  # the same, encoded
        "%2Fetc",  # an absolute path
        "outside",  # a symbolic link to a real run folder outside the root
        "not-a-run",  # a folder in the root that is not a run (no status.json)
        "done%2F..%2F..%2Foutside-run",  # a path that climbs out
        "-rf",  # not a name ortlab accepts
    ],
)
def test_ids_outside_the_runs_root_are_404(api, runs, runs_root, tmp_path, run_id):
    outside = make_fake_run(tmp_path, "outside-run", "stopped", steps=3)
    (runs_root / "outside").symlink_to(outside, target_is_directory=True)
    (runs_root / "not-a-run").mkdir()
    (runs_root / "not-a-run" / "metrics.jsonl").write_text('{"event": "step", "step": 1}\n')
    for method, suffix in (("GET", ""), ("GET", "/metrics"), ("POST", "/stop"), ("POST", "/resume")):
        code, body, _ = api(method, f"runs/{run_id}{suffix}")
        assert code == 404, (method, run_id, suffix, code, body)
        assert set(body) == {"message", "reason"}, "an error says why, and nothing of any run"
    assert not RunDir(outside).stop_requested()
    code, body, _ = api("GET", "runs")
    assert "outside" not in [r["id"] for r in body["runs"]], "a symbolic link is not listed either"


def test_an_absolute_path_to_a_real_run_is_404(api, runs, tmp_path):
    outside = make_fake_run(tmp_path / "elsewhere", "far", "stopped", steps=2)
    encoded = str(outside).replace("/", "%2F")
    for path in (f"runs/{encoded}", f"runs/{encoded}/metrics"):
        code, body, _ = api("GET", path)
        assert code == 404, (path, body)


# --- launch validation -------------------------------------------------------------------------------------


def test_a_bad_spec_is_400_with_the_same_problems_as_everywhere(api, runs_root):
    from ortlab.spec import RunSpec, SpecError

    bad = {"hyper": {"batch_size": 0, "learning_rate": -1}, "colour": "blue", "name": "../escape"}
    code, body, _ = api("POST", "runs", bad)
    assert code == 400, body
    with pytest.raises(SpecError) as expected:
        RunSpec.parse({**bad, "output_dir": str(runs_root)})
    assert body["problems"] == expected.value.problems
    assert any(p.startswith("hyper.batch_size:") for p in body["problems"])
    assert any(p.startswith("colour: unknown field") for p in body["problems"])
    assert any(p.startswith("name:") for p in body["problems"])
    assert body["message"] == "invalid run spec"

    code, body, _ = api("POST", "runs", "{not json")
    assert code == 400 and "not JSON" in body["message"], body
    code, body, _ = api("POST", "runs", [1, 2])
    assert code == 400 and "JSON object" in body["problems"][0], body
    code, body, _ = api("POST", "runs", b"")
    assert code == 400, body
    assert list(runs_root.iterdir()) == [], "no run folder for a refused spec"


def test_an_oversized_or_too_deep_body_is_refused_before_parsing(api, runs_root):
    """A body is read by the event loop that serves every request: over 1 MiB is 413 unparsed, and parsing happens
    off the loop; a body nested deeper than the parser's recursion is a 400, not a 500."""
    from ortlab.server.handlers import MAX_BODY_BYTES

    big = json.dumps({"name": "x" * MAX_BODY_BYTES, "hyper": {"max_steps": 5}})
    code, body, _ = api("POST", "runs", big)
    assert code == 413, body
    assert f"at most {MAX_BODY_BYTES}" in body["message"] and "run spec" in body["message"], body
    code, body, _ = api("POST", "runs", "[" * 200_000)
    assert code == 400 and "not JSON" in body["message"], body
    code, body, _ = api("GET", "runs")
    assert code == 200 and body["runs"] == [], "the server still answers, and no run folder was made"


# --- metrics and rows --------------------------------------------------------------------------------------


def test_metrics_offset_returns_only_new_complete_records(api, runs):
    path = runs["live"] / "metrics.jsonl"
    code, first, _ = api("GET", "runs/live/metrics?offset=0")
    assert code == 200
    assert [r.get("step") for r in first["records"] if r["event"] == "step"] == [1, 2, 3]
    offset = first["offset"]
    assert offset == path.stat().st_size

    code, again, _ = api("GET", f"runs/live/metrics?offset={offset}")
    assert (code, again) == (200, {"records": [], "offset": offset}), "nothing new: nothing returned"

    append(path, step_record(4), step_record(5))
    half = json.dumps(step_record(6))
    with path.open("a") as f:
        f.write(half[:25])  # a line still being written
    code, new, _ = api("GET", f"runs/live/metrics?offset={offset}")
    assert [r["step"] for r in new["records"]] == [4, 5], "only the new complete lines"
    assert new["offset"] == path.stat().st_size - 25, "the offset stops before the unfinished line"

    with path.open("a") as f:
        f.write(half[25:] + "\n")
    code, last, _ = api("GET", f"runs/live/metrics?offset={new['offset']}")
    assert [r["step"] for r in last["records"]] == [6]
    assert last["offset"] == path.stat().st_size

    # '%C2%B2' is '²' and '%D9%A3' is '٣' (str.isdigit says yes to both; int refuses the first, reads the second as 3)
    for bad in ("-1", "abc", "1.5", str(path.stat().st_size + 10), "%C2%B2", "%D9%A3"):
        code, body, _ = api("GET", f"runs/live/metrics?offset={bad}")
        assert code == 400 and "offset" in body["message"], (bad, body)


def test_metrics_max_points_is_honoured_and_checked(api, runs):
    """A long run's answer carries at most `max_points` step records (bounded by default too), keeping the first,
    the last and each bucket's extremes; a bad `max_points` is a 400 that says what is accepted."""
    from ortlab.server.runindex import DEFAULT_MAX_POINTS, MAX_POINTS_LIMIT

    path = runs["live"] / "metrics.jsonl"
    first_step = max(r["step"] for r in map(json.loads, path.read_text().splitlines()) if r.get("step"))
    steps = range(first_step + 1, first_step + DEFAULT_MAX_POINTS + 500)
    append(path, *(step_record(s, loss=1.0 / s, samples_per_s=10.0) for s in steps))
    append(path, {"event": "eval", "step": steps[-1], "eval_loss": 0.5})
    append(path, step_record(steps[-1] + 1, loss=99.0, samples_per_s=10.0))  # a spike, last
    in_file = sum(json.loads(line).get("event") == "step" for line in path.read_text().splitlines())
    code, body, _ = api("GET", "runs/live/metrics?offset=0&max_points=50")
    assert code == 200, body
    sent = [r for r in body["records"] if r["event"] == "step"]
    assert len(sent) <= 50
    assert sent[0]["step"] == 1 and sent[-1]["loss"] == 99.0  # first and last (and the spike) kept
    assert any(r["event"] == "eval" for r in body["records"]), "records that are not steps are all kept"
    assert body["downsampled"] == {"steps_read": in_file, "steps_sent": len(sent)}
    assert body["offset"] == path.stat().st_size
    code, default, _ = api("GET", "runs/live/metrics?offset=0")
    assert code == 200 and sum(r["event"] == "step" for r in default["records"]) <= DEFAULT_MAX_POINTS
    code, whole, _ = api("GET", f"runs/live/metrics?offset=0&max_points={MAX_POINTS_LIMIT}")
    assert code == 200 and "downsampled" not in whole  # a client may ask for every step of a page
    assert sum(r["event"] == "step" for r in whole["records"]) == in_file
    for bad in ("0", "3", str(MAX_POINTS_LIMIT + 1), "-5", "ten", "1e3", "", "%C2%B2", "%D9%A3%D9%A3"):
        code, body, _ = api("GET", f"runs/live/metrics?offset=0&max_points={bad}")
        assert code == 400 and "max_points must be an integer" in body["message"], (bad, body)


def test_a_long_history_comes_in_bounded_chunks(runs, monkeypatch):
    """From offset 0 on a long run, one answer is at most METRICS_CHUNK_BYTES; the next goes on from its offset."""
    from ortlab.server import runindex as server_runs

    monkeypatch.setattr(server_runs, "METRICS_CHUNK_BYTES", 1000)
    run, offset, steps = RunDir(runs["done"]), 0, []
    for _ in range(100):
        answer = server_runs.metrics_since(run, offset)
        if not answer["records"]:
            break
        assert answer["offset"] - offset <= 1000
        steps += [r["step"] for r in answer["records"] if r["event"] == "step"]
        offset = answer["offset"]
    assert steps == list(range(1, 21)), "every record once, in order"
    assert offset == run.metrics_path.stat().st_size


def test_run_rows_say_what_applied_and_follow_new_metrics(api, runs):
    code, body, _ = api("GET", "runs")
    rows = {r["id"]: r for r in body["runs"]}
    done, live = rows["done"], rows["live"]
    assert set(done) >= {
        "id", "state", "step", "max_steps", "samples_per_s", "loss", "requested", "applied", "not_applied", "updated"
    }  # fmt: skip
    assert (done["state"], done["step"], done["max_steps"]) == ("completed", 20, 100)
    assert done["samples_per_s"] == 41.5, "an ended run shows its steady-state throughput"
    assert done["loss"] == pytest.approx(1 / 20)
    assert sorted(done["requested"]) == ["fused_adam", "ort"]
    assert done["applied"] == ["fused_adam"]
    assert done["not_applied"] == ["ort"]
    assert isinstance(done["updated"], float)
    assert rows["stopped"]["state"] == "stopped" and rows["stopped"]["step"] == 7

    assert (live["state"], live["step"], live["samples_per_s"]) == ("running", 3, 40.0)
    append(runs["live"] / "metrics.jsonl", step_record(4, loss=0.125, samples_per_s=55.0))
    code, body, _ = api("GET", "runs")
    live = {r["id"]: r for r in body["runs"]}["live"]
    assert (live["step"], live["loss"], live["samples_per_s"]) == (4, 0.125, 55.0), "rows follow new lines"

    code, detail, _ = api("GET", "runs/live")
    assert code == 200, detail
    assert detail["step"] == 4 and detail["status"]["state"] == "running" and detail["result"] is None


def test_a_replaced_metrics_file_is_read_afresh(api, runs):
    api("GET", "runs")
    path = runs["live"] / "metrics.jsonl"
    tmp = path.with_name("new.jsonl")
    tmp.write_text(json.dumps(step_record(1, loss=9.0)) + "\n")
    os.replace(tmp, path)
    code, body, _ = api("GET", "runs/live")
    assert (code, body["step"], body["loss"]) == (200, 1, 9.0)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("SpecError", 400),
        ("RunStateError", 409),
        ("UnsafePath", 409),
        ("KeyError", 500),
    ],
)
def test_an_ortlab_error_from_a_route_is_4xx_with_its_message_anything_else_500(api, monkeypatch, error, code):
    """No route has a natural way to let one escape today (each says what is wrong itself): the doctor's reader
    stands in for a future route that forgets. An OrtlabError's message is the user's; a bug's stays in the log."""
    from ortlab import safeio
    from ortlab.runfolder.rundir import RunStateError
    from ortlab.server import handlers
    from ortlab.spec import SpecError

    raised = {
        "SpecError": SpecError(["hyper.batch_size: must be >= 1 (got <b>0</b>)"]),
        "RunStateError": RunStateError("run x is completed: only a stopped run can resume"),
        "UnsafePath": safeio.UnsafePath("status.json is a link: not followed"),
        "KeyError": KeyError("secret internals"),
    }[error]

    def fails() -> None:
        raise raised

    monkeypatch.setattr(handlers, "doctor_summary", fails)
    got, body, response = api("GET", "doctor")
    assert got == code, body
    assert response.headers["Content-Type"].startswith("application/json")
    if code == 500:
        assert body["message"] == "Unhandled error" and "secret" not in json.dumps(body), body
    elif error == "SpecError":
        assert body == {"message": "invalid run spec", "problems": raised.problems}, body
    else:
        assert body == {"message": str(raised), "problems": []}, body


def test_a_damaged_spec_is_reported_not_a_500(api, runs):
    (runs["done"] / "spec.yaml").write_text("hyper: [not, a, mapping]\n")
    code, body, _ = api("GET", "runs/done")
    assert code == 200, body
    assert body["spec"] is None and "hyper" in body["spec_error"]


def test_stop_of_an_ended_run_is_409(api, runs):
    for run_id in ("done", "stopped"):
        code, body, _ = api("POST", f"runs/{run_id}/stop")
        assert code == 409 and "only a pending or running run can stop" in body["message"], body
    code, body, _ = api("POST", "runs/live/resume")
    assert code == 409 and "running" in body["message"], body


def _plant(runs_root: Path, name: str, **target: str) -> RunDir:
    """A stopped run with a checkpoint whose spec.yaml names `target`: a folder anyone could have put there."""
    import yaml

    run = RunDir(make_fake_run(runs_root, name, "stopped", steps=3))
    spec = RunSpec.from_run(run).model_dump(mode="json")
    spec["target"].update(target)
    run.spec_path.write_text(yaml.safe_dump(spec))
    (run.checkpoints / "checkpoint-3").mkdir(parents=True)
    (run.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    return run


def test_resume_of_a_planted_folder_runs_nothing_and_sends_no_token(api, runs_root, tmp_path, monkeypatch):
    """One POST must not start the program a folder names, nor send the user's Ray token where it says."""
    from header_recorder import recording_server

    monkeypatch.delenv("ORTLAB_TRUSTED_PYTHONS", raising=False)
    monkeypatch.delenv("ORTLAB_RAY_ADDRESSES", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-users-ray-token")  # the launch helper inherits the server's env
    marker, program = tmp_path / "it-ran", tmp_path / "python"
    program.write_text(f"#!/bin/sh\ntouch {marker}\n")
    program.chmod(0o755)
    planted = _plant(runs_root, "planted-python", python=str(program))
    code, body, _ = api("POST", "runs/planted-python/resume")
    assert code == 409, body
    assert "does not start a program that a run folder names" in body["message"], body
    assert "ORTLAB_TRUSTED_PYTHONS" in body["message"], "the refusal says how to allow it"
    assert not marker.exists(), "the planted interpreter was started"
    assert planted.read_status()["state"] == "stopped"

    monkeypatch.setenv("ORTLAB_STORAGE_URIS", str(tmp_path / "storage"))  # (the storage is the user's: see #48)
    with recording_server("127.0.0.2") as (address, seen):
        planted = _plant(runs_root, "planted-cluster", cluster=address, storage=str(tmp_path / "storage"))
        code, body, _ = api("POST", "runs/planted-cluster/resume")
        assert code == 409 and "ORTLAB_RAY_ADDRESSES" in body["message"], body
        assert seen == [], f"requests reached the address the folder names: {seen}"
    assert planted.read_status()["state"] == "stopped"


def test_resume_of_a_planted_folder_never_claims_a_run_in_the_storage_it_names(api, runs_root, tmp_path, monkeypatch):
    """A planted folder naming a storage folder and, in its status, another run's place there: the resume route
    refuses it before anything is read or written there, saying how to allow it (issue #48)."""
    from ortlab.runfolder.place import new_place
    from ortlab.runner import trust

    monkeypatch.delenv("ORTLAB_STORAGE_URIS", raising=False)
    monkeypatch.setattr(trust, "_named_here", set(), raising=False)
    remote = new_place(tmp_path / "shared", "victim", b"name: victim\n")
    remote.set_status("stopped", step=3)
    (remote.checkpoints / "checkpoint-3").mkdir(parents=True)
    (remote.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    before = {p: p.read_bytes() for p in remote.path.rglob("*") if p.is_file()}
    planted = _plant(runs_root, "victim", cluster="local", storage=str(tmp_path / "shared"))
    planted.update_status(launcher={"kind": "ray-job", "cluster": "local", "job_id": "x", "storage": str(remote.path)})
    code, body, _ = api("POST", "runs/victim/resume")
    assert code == 409, body
    assert "names the storage folder" in body["message"] and "ORTLAB_STORAGE_URIS" in body["message"], body
    assert {p: p.read_bytes() for p in remote.path.rglob("*") if p.is_file()} == before
    assert planted.read_status()["state"] == "stopped"


def test_every_query_of_every_route_is_answered_in_ortlabs_words(api, runs):
    """Non-numbers, huge numbers, negative ones, other digits ('²', '٣'), empty values, repeated parameters: every
    query a route reads is a 400 naming the parameter and what it takes; no route answers 500 or a traceback, and
    a route that reads no query ignores one (issue #48, item 4)."""
    hostile = [
        "abc", "1.5", "-1", "-0", "+3", "%203", "3%20", "0x10", "1e3", "", "9" * 5000, "9" * 19, "%C2%B2", "%D9%A3",
        "%EF%BC%93", "%00", "nan", "inf", "%0A5",
    ]  # fmt: skip
    python_words = ("invalid literal", "Exceeds the limit", "Traceback", "int()", "ValueError")
    for name in ("offset", "max_points"):
        for bad in hostile:
            code, body, _ = api("GET", f"runs/live/metrics?{name}={bad}")
            assert code == 400, (name, bad, code, body)
            assert body["message"].startswith(f"{name} must be"), (name, bad, body)
            assert not any(w in body["message"] for w in python_words), (name, bad, body)
            assert len(body["message"]) < 300, "the value is quoted cut"
    for query in ("offset=0&offset=abc", "offset=abc&offset=0", "max_points=50&max_points=%C2%B2"):
        code, body, _ = api("GET", f"runs/live/metrics?{query}")
        assert code in (200, 400) and isinstance(body, dict), (query, code, body)
        if code == 400:
            assert not any(w in body["message"] for w in python_words), (query, body)
    for method, route in ROUTES:
        if method == "GET" and route != "runs/live/metrics":
            for bad in ("abc", "9" * 5000, "%C2%B2", ""):
                code, body, _ = api(method, f"{route}?offset={bad}&max_points={bad}&x={bad}")
                assert code == 200, (route, bad, code, body)


def test_stop_on_a_planted_folder_never_writes_through_its_links(api, runs_root, tmp_path):
    # A folder planted under the runs root: control/stop links to a file of the user's. Stop replaces the link
    # with its own file; a forged pid (a live process that is not the run's) shows as damaged and is refused.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = RunDir.create(runs_root, ortlab.RunSpec(name="planted"))
    planted.update_status(updated=time.time())  # claimed a moment ago: pending, Stop allowed
    os.symlink(victim, planted.path / "control" / "stop")
    code, body, _ = api("POST", "runs/planted/stop")
    assert code == 202, body
    assert victim.read_text() == "precious"
    assert (planted.path / "control" / "stop").is_file() and not (planted.path / "control" / "stop").is_symlink()

    forged = RunDir.create(runs_root, ortlab.RunSpec(name="forged"))
    parent = os.getppid()
    forged.set_status("running", pid=parent, create_time=process_create_time(parent))
    code, body, _ = api("POST", "runs/forged/stop")
    assert code == 409 and "damaged" in body["message"] and f"pid {parent}" in body["message"], body
    assert not forged.stop_requested()
    code, body, _ = api("GET", "runs")
    row = next(r for r in body["runs"] if r["id"] == "forged")
    assert row["state"] == "damaged" and "not this run's" in row["error"]


# --- settings, install, weight -----------------------------------------------------------------------------


def test_the_runs_root_setting_and_its_defaults(tmp_path, monkeypatch):
    from ortlab.server import runs_root_for

    monkeypatch.delenv("ORTLAB_RUNS", raising=False)
    assert runs_root_for("", tmp_path) == (tmp_path / "ortlab-runs").resolve()
    assert runs_root_for("mine", tmp_path) == (tmp_path / "mine").resolve()
    assert runs_root_for(str(tmp_path / "abs"), "/elsewhere") == (tmp_path / "abs").resolve()
    monkeypatch.setenv("ORTLAB_RUNS", str(tmp_path / "env"))
    assert runs_root_for("", tmp_path / "x") == (tmp_path / "env").resolve()
    assert runs_root_for("setting-wins", tmp_path) == (tmp_path / "setting-wins").resolve()


def test_installing_ortlab_enables_the_extension(tmp_path):
    """The wheel ships the config file that enables `ortlab`; with it, the server lists the extension as OK."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    source = "jupyter-config/jupyter_server_config.d/ortlab.json"
    assert shared[source] == "etc/jupyter/jupyter_server_config.d/ortlab.json"
    config_dir = tmp_path / "jupyter-config"
    (config_dir / "jupyter_server_config.d").mkdir(parents=True)
    shutil.copy(ROOT / source, config_dir / "jupyter_server_config.d" / "ortlab.json")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PYTHON, "-m", "jupyter_server.extension.serverextension", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    assert re.search(r"^\s*ortlab enabled\s*$", text, re.M), text
    assert re.search(r"^\s*ortlab \S+ OK\s*$", text, re.M), text


def test_the_server_side_never_imports_torch(runs, runs_root):
    """Listing, details, metrics, spec checks and the doctor: all without torch (seconds and ~300 MB)."""
    code = f"""
import json, sys
from pathlib import Path
import ortlab.server, ortlab.server.handlers
import ortlab
from ortlab.runfolder.processes import process_create_time
from ortlab.runfolder.rundir import RunDir
from ortlab.server.handlers import doctor_summary
from ortlab.server.runindex import RunIndex, metrics_since
from ortlab.spec import RunSpec
index = RunIndex({str(runs_root)!r})
rows = index.rows()
detail = index.detail(RunDir({str(runs["done"])!r}))
metrics_since(RunDir({str(runs["live"])!r}), 0)
RunSpec.parse({{"accel": {{"ort": True, "precision": "bf16"}}}})
doctor_summary()
from ortlab.specfields import form
form()
print(json.dumps({{"rows": len(rows), "torch": "torch" in sys.modules, "spec": detail["spec"] is not None}}))
"""
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rows": 3, "torch": False, "spec": True}


def test_the_estimate_route_answers_before_launch(api, runs_root, tiny_bert):
    """The sidebar and the workbench ask for the estimate as the form changes: the same `ortlab.estimator` answer
    as `ortlab estimate`, or 400 with why not; nothing is launched."""
    spec = {"model": {"name": str(tiny_bert)}, "hyper": {"batch_size": 8}}
    code, body, _ = api("POST", "estimate", {"spec": spec, "device": "cpu", "price_per_hour": 1.5})
    assert code == 200, body
    assert body["peak_mem_mb"]["value"] > 0 and body["step_time_s"]["value"] > 0 and body["cost"] > 0
    assert "weights" in [t["name"] for t in body["memory"]] and "peak" in body["table"]
    code, body, _ = api("POST", "estimate", {"spec": spec, "device": "H100 SXM"})
    assert code == 200 and body["device"] == "H100 SXM", body
    code, body, _ = api("POST", "estimate", {"spec": spec, "device": "Voodoo"})
    assert code == 400 and "not in ortlab's table" in body["message"], body
    code, body, _ = api("POST", "estimate", {"spec": {"hyper": {"batch_size": 0}}})
    assert code == 400 and body["problems"], body
    code, body, _ = api("POST", "estimate", ["not", "an", "object"])
    assert code == 400, body
    assert list(runs_root.iterdir()) == []


def test_the_estimate_route_fits_a_budget_and_says_what_launch_would_refuse(api, runs_root, tiny_bert):
    """As the workbench's note: with a budget, the estimate of the spec fitted to it (the launch's own fit) and what
    the fit changes; a spec Launch would refuse carries the refusal's text (numbers and remedies); a budget that
    nothing meets is a 400 naming the closest budget."""
    from ortlab.estimator.budget import fit_spec_budget
    from ortlab.spec import RunSpec

    spec = {"model": {"name": str(tiny_bert)}, "hyper": {"batch_size": 8, "max_steps": 20}}
    code, plain, _ = api("POST", "estimate", {"spec": spec})
    assert code == 200 and plain["fitted"] == [] and plain["refusal"] is None, plain
    minutes = (plain["total_time_s"]["value"] - 15 * plain["step_time_s"]["value"]) / 60  # five of the 20 steps
    budgeted = {**spec, "budget": {"minutes": minutes}}
    code, body, _ = api("POST", "estimate", {"spec": budgeted, "price_per_hour": 2.0})
    assert code == 200, body
    expected = fit_spec_budget(RunSpec.parse(budgeted))
    assert body["fitted"] == expected.choices and body["fitted"][0].startswith("max_steps"), body["fitted"]
    assert body["steps"] == expected.estimate.steps < 20 and body["cost"] > 0, body
    code, body, _ = api("POST", "estimate", {"spec": budgeted, "device": "T4"})
    assert code == 400 and "leave device out" in body["message"], body
    code, body, _ = api("POST", "estimate", {"spec": {**spec, "budget": {"minutes": 0.0001}}})
    assert code == 400 and "closest budget" in body["message"], body
    huge = {"model": {"name": str(tiny_bert)}, "hyper": {"batch_size": 2**20, "max_length": 512}}
    code, body, _ = api("POST", "estimate", {"spec": huge})
    assert code == 200 and body["fits"] is False, body
    assert body["refusal"].startswith("this run needs about") and "Remedies" in body["refusal"], body["refusal"]
    assert list(runs_root.iterdir()) == []


def test_the_spec_route_gives_the_new_run_form_every_task(api):
    """The sidebar's form takes its task choices and defaults from here: seq2seq, the newest task, is among them,
    and so is every field's description (the form's tooltips)."""
    code, body, _ = api("GET", "spec")
    assert code == 200, body
    schema = body["schema"]
    assert schema["properties"]["task"]["enum"] == list(TASKS)
    assert "seq2seq" in schema["properties"]["task"]["enum"]
    hyper = schema["$defs"]["HyperSpec"]["properties"]
    assert hyper["batch_size"]["description"] == HyperSpec.model_fields["batch_size"].description
    # The defaults a factory builds (the capped embedded dataset) are not in the schema: they come alongside.
    assert body["defaults"]["data"]["max_train_samples"] == RunSpec().data.max_train_samples
    assert body["defaults"]["model"]["name"] == RunSpec().model.name


# --- real runs through the API -----------------------------------------------------------------------------


def _wait(api: Api, run_id: str, until: Any, timeout: float = 300, what: str = "") -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, body, _ = api("GET", f"runs/{run_id}")
        assert code == 200, body
        if until(body):
            return body
        assert time.monotonic() < deadline, f"{what}: still {body['state']} after {timeout} s: {body['status']}"
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_launch_stop_resume_through_the_api(api, runs_root, tiny_bert, tmp_path):
    from ortlab.runner import Run

    spec = {
        "name": "api-run",
        "output_dir": str(tmp_path / "not-here"),  # a request cannot choose where to write
        "model": {"name": str(tiny_bert)},
        "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 2000, "max_eval_samples": 16},
        "hyper": {"learning_rate": 1e-3, "batch_size": 8, "max_length": 32, "max_steps": 12},
        # precision pinned: 'auto' picks bf16 on a CPU where a measurement found it faster (AMX Xeons do)
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},
    }
    code, body, _ = api("POST", "runs", spec)
    assert code == 201, body
    run_id = body["id"]
    assert run_id == "api-run" and Path(body["path"]) == runs_root.resolve() / "api-run"
    assert not (tmp_path / "not-here").exists()
    run = Run(body["path"])
    run.pause(at_step=3)  # hold it there (the worker is still importing torch), so it is running when we stop it
    try:
        row = _wait(api, run_id, lambda b: b["paused"] or b["state"] in ("failed", "completed"), what="reach step 3")
        assert row["state"] == "running", row["status"]
        assert row["step"] >= 3 and row["max_steps"] == 12
        assert isinstance(row["loss"], float) and isinstance(row["samples_per_s"], float)
        # (nothing but tcmalloc, which a launched run gets by itself where it is installed)
        assert row["requested"] == (["tcmalloc"] if tcmalloc.find() else []) and row["not_applied"] == []
        _, metrics, _ = api("GET", f"runs/{run_id}/metrics?offset=0")
        seen = metrics["offset"]
        assert [r["step"] for r in metrics["records"] if r["event"] == "step"][:3] == [1, 2, 3]

        code, body, _ = api("POST", f"runs/{run_id}/stop")
        assert (code, body["state"]) == (202, "running"), body
        stopped = _wait(api, run_id, lambda b: b["state"] in ("stopped", "failed", "completed"), what="stop")
        assert stopped["state"] == "stopped", stopped["status"]
        at = stopped["status"]["step"]
        assert 3 <= at < 12
        code, body, _ = api("POST", f"runs/{run_id}/stop")
        assert code == 409, body

        code, body, _ = api("POST", f"runs/{run_id}/resume")
        assert (code, body) == (202, {"id": run_id, "state": "pending"})
        code, body, _ = api("POST", f"runs/{run_id}/resume")
        assert code == 409, "a second resume of a resumed run is refused"
        done = _wait(api, run_id, lambda b: b["state"] in ("completed", "failed"), what="finish")
        assert done["state"] == "completed", done["status"]
        assert done["step"] == 12 and done["result"]["summary"]["steps"] == 12

        _, later, _ = api("GET", f"runs/{run_id}/metrics?offset={seen}")
        steps = [r["step"] for r in later["records"] if r["event"] == "step"]
        assert steps == list(range(steps[0], 13)) and steps[0] > 3, "only what came after the offset"
        assert [r["step"] for r in later["records"] if r["event"] == "resume"] == [at]
        code, body, _ = api("POST", f"runs/{run_id}/resume")
        assert code == 409 and "completed" in body["message"]
    finally:
        run.unpause()
        if run.state in ("pending", "running"):
            run.stop(timeout=60)


@pytest.mark.slow
def test_a_mix_this_machine_cannot_run_is_400_with_the_mix_problems(api, runs_root):
    """The launch's machine check (the doctor's report, in the server's own process: no helper) refuses what the
    target cannot run, with the same words as `ortlab.runner.preflight`, before any run folder exists."""
    from ortlab.runner import RunError, preflight
    from ortlab.spec import RunSpec

    try:
        preflight(RunSpec.parse({"accel": {"precision": "fp16"}}))
        pytest.skip("this machine has CUDA: fp16 is a valid mix here")
    except RunError as e:
        expected = str(e)
    code, body, _ = api("POST", "runs", {"accel": {"precision": "fp16"}})
    assert code == 400, body
    assert body["problems"] == [expected] and "accel: fp16 is not available in this Python" in expected
    assert list(runs_root.iterdir()) == []
