"""Cluster runs whose storage is an object store (`target.storage: s3://...`): no disk shared with the cluster.

The store is a real S3-protocol server on loopback (conftest's `s3_server`: moto's server mode, in its own process)
spoken to by pyarrow's real S3 client, on both sides. The live tests run real Ray jobs on the session's cluster:
the job trains in a node-local folder and keeps the store in step; the local monitor brings the results home
through the store's client.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from gates import launch_gated, wait_paused

from ortlab.job.mirror import Mirror, jobs_dir
from ortlab.runfolder.objstore import UPLOADED, Store, StoredRun, StoreError
from ortlab.runfolder.place import bring_home
from ortlab.runfolder.rundir import RunDir, RunStateError
from ortlab.runner import RunError
from ortlab.runner.rayjob import RayJob
from ortlab.runner.raytrainjob import RayTrain
from ortlab.runner.trust import STORAGES_ENV
from ortlab.spec import RunSpec, SpecError


def live(test):
    """A test with real Ray jobs on the session's cluster (its tests share one xdist worker: see conftest)."""
    for mark in (pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("ray-cluster")):
        test = mark(test)
    return test


def steps_of(run) -> list[int]:
    return [r["step"] for r in run.metrics() if r["event"] == "step"]


def stored_objects(uri: str) -> dict[str, bytes]:
    store = Store(uri)
    return {name: store.read_bytes(name, limit=1 << 30) for name in store.files()}


# --- the store, the stored run and the job's mirror, without a cluster ------------------------------------------


def test_a_stored_run_brings_home_only_whole_checkpoints_and_nothing_outside_its_folder(s3_store, tmp_path):
    import boto3

    stored = StoredRun(Store(s3_store).child("r1"))
    stored.create(b"name: r1\n")
    store = stored.store
    store.write_bytes("model/config.json", b"{}")
    store.write_bytes("result.json", b'{"summary": {"steps": 4}}')
    for step in (2, 4):
        store.write_bytes(f"checkpoints/checkpoint-{step}/trainer_state.json", b"{}")
    store.write_bytes(f"checkpoints/checkpoint-2/{UPLOADED}", b"")  # checkpoint-4's upload never finished
    # A key no local path may take: written raw, as anyone with access to the bucket could.
    bucket, prefix = store.root.split("/", 1)
    endpoint = s3_store.split("endpoint_override=")[1].split("&")[0]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/model/../../../escaped.txt", Body=b"x")
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert f"{prefix}/model/../../../escaped.txt" in listed, "the store keeps the key as written"

    home = RunDir(tmp_path / "home" / "r1")
    home.path.mkdir(parents=True)
    assert bring_home(stored, home) == []
    assert json.loads((home.path / "result.json").read_text()) == {"summary": {"steps": 4}}
    assert (home.path / "model" / "config.json").read_bytes() == b"{}"
    assert home.last_checkpoint().name == "checkpoint-2", "only a checkpoint whose upload finished is whole"
    assert not (home.path / "checkpoints" / "checkpoint-2" / UPLOADED).exists()
    assert not any(p.name == "escaped.txt" for p in tmp_path.rglob("*")), "a '..' key landed outside the folder"


def test_the_jobs_mirror_pulls_controls_and_pushes_checkpoints_once_whole(s3_store, tmp_path):
    stored = StoredRun(Store(s3_store).child("m1"))
    stored.create(b"name: m1\n")
    stored.request_pause(3)
    mirror = Mirror(stored, RunDir(tmp_path / "node" / "m1"))
    mirror.pull(resume=False)
    local = mirror.local
    assert local.spec_path.read_bytes() == b"name: m1\n" and local.read_status()["state"] == "pending"
    assert local.read_pause() == "3", "a gate set before the job started holds it"

    # What training writes: a cut checkpoint (no trainer_state.json yet), the stream, a status.
    (local.path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (local.path / "checkpoints" / "checkpoint-2" / "model.safetensors").write_bytes(b"w" * 1000)
    (local.path / "metrics.jsonl").write_text('{"event": "step", "step": 1}\n')
    mirror.sync(force=True)
    assert stored.last_checkpoint() is None, "a checkpoint still being written is not pushed"
    (local.path / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    stored.request_stop()
    stored.clear_pause()
    mirror.sync(force=True)
    objects = stored_objects(stored.path)
    assert stored.last_checkpoint() == "checkpoint-2"
    assert objects["checkpoints/checkpoint-2/model.safetensors"] == b"w" * 1000
    assert objects["metrics.jsonl"] == b'{"event": "step", "step": 1}\n'
    assert local.stop_requested() and local.read_pause() is None, "stop and unpause came in from the store"

    stored.set_status("stopped", step=2)
    stored.claim(resumed=True)
    assert stored.read_status()["state"] == "pending" and not stored.store.exists("control/stop")
    with pytest.raises(RunStateError, match="is pending"):
        stored.claim()


def test_the_live_stream_is_pushed_often_while_short_and_seldom_once_long(s3_store, tmp_path):
    """A Ray Train rank 0 pushes a grown stream every LIVE_S, rewritten whole (an object cannot be appended to);
    a long stream waits its turn (8 MiB: 8 s), so a long run does not re-upload megabytes four times a second.
    The driver's follower reads only the part it has not got."""
    from ortlab.job.mirror import Follower
    from ortlab.wire import LIVE_S

    stored = StoredRun(Store(s3_store).child("live"))
    stored.create(b"name: live\n")
    mirror = Mirror(stored, RunDir(tmp_path / "rank0" / "live"), checkpoints=False, metrics_every=LIVE_S)
    mirror.pull(resume=False)
    follower = Follower(stored, RunDir(tmp_path / "driver" / "live"))
    follower.local.path.mkdir(parents=True)
    short = b'{"event": "step", "step": 1}\n'
    mirror.local.metrics_path.write_bytes(short)
    mirror.sync()
    follower.pull()
    assert follower.local.metrics_path.read_bytes() == short
    with mirror.local.metrics_path.open("ab") as f:
        f.write(b'{"event": "step", "step": 2, "pad": "' + b"x" * (8 << 20) + b'"}\n')
    mirror.metrics_at = 0.0  # (as if LIVE_S had passed)
    mirror.sync()
    pushed = stored_objects(stored.path)["metrics.jsonl"]
    assert pushed == mirror.local.metrics_path.read_bytes(), "a grown short stream: pushed"
    with mirror.local.metrics_path.open("ab") as f:
        f.write(b'{"event": "step", "step": 3}\n')
    mirror.metrics_at = time.monotonic() - 1.0  # (as if a second had passed: four LIVE_S, but not 8 s)
    mirror.sync()
    assert stored_objects(stored.path)["metrics.jsonl"].count(b"\n") == 2
    mirror.sync(force=True)
    assert stored_objects(stored.path)["metrics.jsonl"] == mirror.local.metrics_path.read_bytes()
    follower.pull()
    assert follower.local.metrics_path.read_bytes() == mirror.local.metrics_path.read_bytes()


def test_a_storage_this_machine_cannot_write_is_named_with_the_reason(s3_server):
    store = Store(f"s3://no-such-bucket-ortlab/runs?endpoint_override={s3_server}&scheme=http")
    with pytest.raises(StoreError, match=r"cannot write and read s3://no-such-bucket-ortlab/runs"):
        store.probe()


@pytest.mark.parametrize(
    ("storage", "says"),
    [
        ("s3://AKIA:secret@bucket/runs", "carries credentials"),
        ("s3://bucket/runs?secret_key=abc", "credential in its query"),
        ("ftp://bucket/runs", "ftp:// is not a storage ortlab knows"),
        ("s3:///runs", "names no bucket"),
        ("s3://bucket/runs/%2e%2e/other", r"'\.\.' segment"),
        ("s3://bucket/runs?endpoint_override=http://AKIA:secret@127.0.0.1:9000", "option endpoint_override carries"),
    ],
)
def test_a_storage_uri_with_a_credential_or_an_unknown_scheme_is_refused(storage, says):
    with pytest.raises(SpecError, match=says) as e:
        RunSpec.parse({"target": {"cluster": "local", "storage": storage}})
    assert "secret" not in str(e.value).replace("secret_key", ""), "the credential is not quoted"


# --- live: Ray jobs on the session's cluster -------------------------------------------------------------------


@live
def test_a_run_on_object_storage_stops_resumes_and_comes_home(ray_head, remote_spec, s3_store, monkeypatch):
    from ortlab import cluster

    spec = remote_spec("s3-run", max_steps=8, storage=s3_store)
    run = launch_gated(spec, at_step=3)
    wait_paused(run, timeout=150)
    assert run.status()["launcher"]["storage"].startswith(s3_store.split("?")[0] + "/s3-run")
    status = run.stop(timeout=120)
    # Held before step 4: a stop lets that step finish, then saves and exits.
    assert status["state"] == "stopped" and status["step"] == 4, status
    assert run.dir.last_checkpoint().name == "checkpoint-4", "the checkpoint came home through the store"
    stored = StoredRun(Store(run.status()["launcher"]["storage"]))
    assert stored.last_checkpoint() == "checkpoint-4" and stored.read_status()["state"] == "stopped"

    # A run folder names its store; ortlab uses this machine's credentials there only where the user said so.
    monkeypatch.delenv(STORAGES_ENV, raising=False)
    with pytest.raises(RunError, match=STORAGES_ENV):
        run.resume()
    bucket_only = s3_store.replace("/runs?", "?")
    monkeypatch.setenv(STORAGES_ENV, bucket_only.replace("scheme=http", "scheme=https"))
    with pytest.raises(RunError, match=STORAGES_ENV):
        run.resume()  # (the options, the endpoint among them, are part of what the user vouches for)
    monkeypatch.setenv(STORAGES_ENV, bucket_only)  # a folder inside a listed store is trusted
    run.resume()
    assert run.wait(timeout=150)["state"] == "completed", (run.status(), run.dir.log_path.read_text()[-3000:])
    assert steps_of(run) == list(range(1, 9)), "resumed where it stopped, nothing twice, nothing missing"
    assert (run.path / "model" / "config.json").is_file() and run.result()["summary"]["steps"] == 8

    objects = stored_objects(stored.path)
    assert json.loads(objects["status.json"])["state"] == "completed"
    assert "model/config.json" in objects and "result.json" in objects
    stored_steps = [r["step"] for r in map(json.loads, objects["metrics.jsonl"].splitlines()) if r["event"] == "step"]
    assert stored_steps == list(range(1, 9)), "the store holds the whole stream too (what a later resume reads)"
    # No shared disk was used: nothing of this run in the cluster's own storage folder, and the job's node-local
    # copies were removed once everything was in the store.
    assert not list((cluster.cluster_dir() / "storage").glob("s3-run*"))
    assert not list(jobs_dir().glob(f"*/{stored.id}"))
    # The store's credentials are the environment's, on each side: never written anywhere.
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    assert not any(secret in data for data in objects.values())
    assert not any(secret in p.read_bytes() for p in run.path.rglob("*") if p.is_file())


@live
def test_object_storage_is_checked_before_anything_starts(ray_head, remote_spec, s3_server, s3_store):
    missing = f"s3://no-such-bucket-ortlab/runs?endpoint_override={s3_server}&scheme=http"
    with pytest.raises(RunError, match="this machine cannot write and read"):
        RayJob().preflight(RunSpec.parse(remote_spec("nope", storage=missing)))
    RayTrain().preflight(RunSpec.parse(remote_spec("two", storage=s3_store, processes=2)))  # both sides can use it
