"""Issue #48, Low: the cluster's doctor ran as a job on every launch (each CLI launch is a new process, so the
in-process cache never helped) and failed the launch when it took longer than DOCTOR_TIMEOUT_S on a busy machine.
Now its answer is kept on disk per cluster session, and a slow doctor does not fail a launch by itself. No cluster:
a client that answers like one."""

from __future__ import annotations

import json

import pytest

from ortlab.job.channel import DOCTOR_TAG
from ortlab.runner import rayjob
from ortlab.spec import RunSpec

REPORT = {
    "accelerations": {},
    "resources": {"CPU": 8.0, "GPU": 0.0},
    "nodes": [{"CPU": 8.0, "GPU": 0.0}],
}


class _Cluster:
    """A Ray Jobs client: `finishes` says whether a doctor job ever ends; `session` is the head's session name."""

    def __init__(self, finishes: bool = True, session: str = "session_2026-11-28_1"):
        self.finishes, self.session, self.submitted, self.stopped = finishes, session, [], []

    def get_address(self) -> str:
        return "http://127.0.0.1:8265"

    def submit_job(self, **kwargs) -> str:
        self.submitted.append(kwargs["submission_id"])
        return kwargs["submission_id"]

    def get_job_status(self, job: str):
        class State:
            value = "SUCCEEDED" if self.finishes else "RUNNING"

        return State()

    def get_job_logs(self, job: str) -> str:  # (main's way: the whole log)
        return "importing torch\n" + DOCTOR_TAG + json.dumps(REPORT) + "\n"

    def stop_job(self, job: str) -> None:
        self.stopped.append(job)

    def _do_request(self, method: str, endpoint: str, **kwargs):
        cluster = self

        class Answer:
            status_code = 200

            def json(self):
                return {"session_name": cluster.session}

            def iter_content(self, chunk_size):
                yield b"importing torch\n" + (DOCTOR_TAG + json.dumps(REPORT) + "\n").encode()

        return Answer()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    found = {"client": _Cluster()}
    monkeypatch.setattr(rayjob, "_client", lambda spec: found["client"])
    monkeypatch.setattr(rayjob, "_doctors", {}, raising=False)  # (main's in-process cache: each call a new process)
    return found


SPEC = RunSpec.parse({"target": {"cluster": "local"}})


def test_the_doctors_answer_is_kept_for_the_clusters_session(cluster, monkeypatch):
    first = cluster["client"]
    assert rayjob.cluster_doctor(SPEC)["resources"] == REPORT["resources"]
    monkeypatch.setattr(rayjob, "_doctors", {}, raising=False)
    cluster["client"] = again = _Cluster()  # the next `ortlab train --cluster local`: a new process
    assert rayjob.cluster_doctor(SPEC)["resources"] == REPORT["resources"]
    assert len(first.submitted) == 1 and again.submitted == [], "the second launch asked the cached answer"
    cluster["client"] = restarted = _Cluster(session="session_2026-11-28_2")
    monkeypatch.setattr(rayjob, "_doctors", {}, raising=False)
    monkeypatch.setattr(rayjob, "DOCTOR_TTL_S", 0.0)
    rayjob.cluster_doctor(SPEC)
    assert len(restarted.submitted) == 1, "a restarted head (another session) is asked again"


def test_a_slow_doctor_does_not_fail_the_launch(cluster, monkeypatch):
    monkeypatch.setattr(rayjob, "DOCTOR_TIMEOUT_S", 0.0)
    monkeypatch.setattr(rayjob, "probe_storage", lambda storage: None)
    cluster["client"] = slow = _Cluster(finishes=False)
    with pytest.warns(RuntimeWarning, match="did not finish on local within 0 s .* launched without the cluster's"):
        report = rayjob.RayJob().preflight(SPEC)
    assert "unchecked" in report and slow.stopped == slow.submitted, "the slow doctor job is stopped"
    # Once the cluster has answered, a later slow doctor uses that answer, saying from when.
    cluster["client"] = _Cluster()
    monkeypatch.setattr(rayjob, "DOCTOR_TIMEOUT_S", 180.0)
    rayjob.cluster_doctor(SPEC)
    monkeypatch.setattr(rayjob, "DOCTOR_TIMEOUT_S", 0.0)
    monkeypatch.setattr(rayjob, "DOCTOR_SESSION_TTL_S", 0.0, raising=False)
    monkeypatch.setattr(rayjob, "DOCTOR_TTL_S", 0.0)
    monkeypatch.setattr(rayjob, "_doctors", {}, raising=False)
    cluster["client"] = _Cluster(finishes=False)
    with pytest.warns(RuntimeWarning, match="its answer of .* is used"):
        report = rayjob.RayJob().preflight(SPEC)
    assert report["resources"] == REPORT["resources"] and "stale" in report


def test_a_cached_answer_that_is_damaged_is_asked_again(cluster):
    rayjob.cluster_doctor(SPEC)
    from ortlab.envvars import cache_dir

    for path in (cache_dir() / "cluster-doctor").iterdir():
        path.write_text('{"key": 1')
    cluster["client"] = again = _Cluster()
    assert rayjob.cluster_doctor(SPEC)["resources"] == REPORT["resources"] and len(again.submitted) == 1
