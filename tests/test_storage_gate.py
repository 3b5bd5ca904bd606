"""One gate for every storage a run folder names, a folder as much as an object store (issue #48, item 2).

A cluster run's storage (`target.storage`) holds the remote places of other runs: the user's other runs folders',
and anyone's who shares it. A planted run folder naming that storage, and in its status the remote place of a
victim run, once had `bring_home()` copy the victim's model, result and checkpoint into the planted folder, and a
resume claim the victim's remote status. Each test plants such a folder, acts on it through one face (notebook,
CLI, server in tests/test_server.py), and compares the victim's files byte for byte. Fast: no cluster, no model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ortlab.runner as runner
from ortlab.runfolder.place import bind, new_place, place_in
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run, RunError, trust
from ortlab.runner.trust import STORAGES_ENV, storage_trusted
from ortlab.spec import RunSpec, SpecError


@pytest.fixture(autouse=True)
def nothing_named(monkeypatch):
    """No storage listed or named in this process unless a test says so."""
    monkeypatch.delenv(STORAGES_ENV, raising=False)
    monkeypatch.setattr(trust, "_named_here", set(), raising=False)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def victim(tmp_path: Path) -> RunDir:
    """Another run's remote place in a storage folder: stopped, with a model, a result and a checkpoint."""
    remote = new_place(tmp_path / "shared", "exp-1", b"name: exp-1\n")
    remote.set_status("stopped", step=3)
    (remote.model_dir).mkdir()
    (remote.model_dir / "config.json").write_text('{"secret": "the victim\'s model"}')
    remote.result_path.write_text(json.dumps({"summary": {"steps": 3}}))
    (remote.checkpoints / "checkpoint-3").mkdir(parents=True)
    (remote.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    return remote


def _planted(root: Path, victim: RunDir) -> RunDir:
    """A stopped run folder with a checkpoint, named as the victim's run, whose spec names the victim's storage
    and whose status names the victim's remote place (what `new_place` would have recorded for it)."""
    spec = RunSpec.parse({"name": victim.id, "target": {"cluster": "local", "storage": str(victim.path.parent)}})
    run = RunDir.create(root, spec)
    assert run.id == victim.id
    run.set_status("stopped", step=3)
    run.update_status(launcher={"kind": "ray-job", "cluster": "local", "job_id": "x", "storage": str(victim.path)})
    (run.checkpoints / "checkpoint-3").mkdir(parents=True)
    (run.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    return run


class _NoCluster:
    """A Ray Jobs client that says the previous job ended, and refuses a new one (no monitor is ever started)."""

    def get_job_status(self, job_id: str):
        return type("Status", (), {"value": "STOPPED"})()

    def submit_job(self, **kwargs):
        raise RuntimeError("no cluster in this test")


@pytest.fixture
def no_cluster(monkeypatch):
    """Resume gets as far as the claim without a cluster: the doctor's check passes, the client is a fake."""
    from ortlab.runner import rayjob

    monkeypatch.setattr(rayjob.RayJob, "preflight", lambda self, spec: {})
    monkeypatch.setattr(rayjob, "_client", lambda spec: _NoCluster())


REFUSED = r"names the storage folder .* which holds other runs' folders.*list it in \$ORTLAB_STORAGE_URIS"


def test_bring_home_of_a_planted_folder_copies_nothing_from_another_run(tmp_path, victim):
    before = _snapshot(victim.path)
    planted = _planted(tmp_path / "runs", victim)
    with pytest.raises(RunError, match=REFUSED):
        Run(planted.path).bring_home()
    assert not planted.model_dir.exists() and planted.result() is None, "the victim's results were copied"
    assert _snapshot(victim.path) == before


@pytest.mark.parametrize("named", [{}, {"cluster": "local"}])
def test_resume_of_a_planted_folder_never_claims_another_run(tmp_path, victim, no_cluster, named):
    before = _snapshot(victim.path)
    planted = _planted(tmp_path / "runs", victim)
    with pytest.raises(RunError, match=REFUSED):
        Run(planted.path).resume(**named)  # naming the cluster is not naming the storage
    assert _snapshot(victim.path) == before, "the victim's remote status was claimed"
    assert planted.read_status()["state"] == "stopped"


@pytest.mark.parametrize("named", [[], ["--cluster", "local"]])
def test_cli_resume_of_a_planted_folder_says_how_to_allow_it(tmp_path, victim, no_cluster, named):
    from ortlab.cli import app

    before = _snapshot(victim.path)
    planted = _planted(tmp_path / "runs", victim)
    result = CliRunner().invoke(app, ["resume", str(planted.path), *named], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert "names the storage folder" in result.output and STORAGES_ENV in result.output, result.output
    assert "Traceback" not in result.output
    assert _snapshot(victim.path) == before


def test_a_listed_storage_folder_is_used_and_a_link_out_of_it_is_not(tmp_path, victim, no_cluster, monkeypatch):
    """The user's own run in a storage they listed comes home; the gate compares real paths, so listing a folder
    does not let a storage that is a link out of it (or a `..` out of it) through."""
    shared = victim.path.parent
    monkeypatch.setenv(STORAGES_ENV, f"/nowhere file://{shared}")
    assert storage_trusted(str(shared)) and storage_trusted(str(shared / "sub"))
    assert not storage_trusted(str(shared / ".." / "elsewhere")) and not storage_trusted(str(shared) + "2")
    (shared / "out").symlink_to(tmp_path / "elsewhere")
    assert not storage_trusted(str(shared / "out"))
    monkeypatch.setenv(STORAGES_ENV, "relative/shared")
    assert not storage_trusted("relative/shared"), "a listed folder is absolute (relative to which folder?)"

    monkeypatch.setenv(STORAGES_ENV, str(shared))
    planted = _planted(tmp_path / "runs", victim)
    before = _snapshot(victim.path)
    with pytest.raises(RunError, match="not the one this run folder's launch made"):
        Run(planted.path).bring_home()  # a listed storage, a folder named as the user's run: still not its place
    assert not planted.model_dir.exists() and _snapshot(victim.path) == before
    mine = planted
    bind(victim, mine)  # (now: the user's own run, its storage listed, the place its launch made)
    Run(mine.path).bring_home()
    assert (mine.model_dir / "config.json").read_bytes() == (victim.model_dir / "config.json").read_bytes()


def test_a_run_launched_in_this_process_resumes_and_comes_home_without_a_listing(tmp_path, monkeypatch):
    """The user's own spec names its storage: `launch` remembers it for this process (the sidebar's server too),
    so its run's monitor, a bring-home and a resume work as before; a run folder never adds to that."""
    monkeypatch.setattr(runner, "preflight", lambda spec, launcher=None: {})
    monkeypatch.setattr(runner, "_start", lambda run, spec, resume=False, cwd=None, hub_token=True, launcher=None: None)
    storage = tmp_path / "mine"
    assert not storage_trusted(str(storage))
    Run(_planted_plain(tmp_path / "other", storage).path)  # reading a folder names nothing
    assert not storage_trusted(str(storage))
    runner.launch({"output_dir": str(tmp_path / "runs"), "target": {"cluster": "local", "storage": str(storage)}})
    assert storage_trusted(str(storage)) and not storage_trusted(str(tmp_path / "theirs"))


def _planted_plain(root: Path, storage: Path) -> RunDir:
    return RunDir.create(root, RunSpec.parse({"target": {"cluster": "local", "storage": str(storage)}}))


def test_a_remote_place_is_exactly_where_the_launch_put_it(tmp_path):
    storage = tmp_path / "shared"
    run = RunDir.create(tmp_path / "runs", RunSpec(name="r1"))
    place = new_place(storage, "r1", b"name: r1\n")
    assert place_in(storage, run, str(place.path)) is None, "a place this folder's launch did not make (no secret)"
    bind(place, run)
    assert place_in(storage, run, str(place.path)) is not None
    for recorded in (
        f"{storage}/../shared/r1",  # the same folder, spelled with '..'
        f"{storage}/./r1",
        "shared/r1",  # relative: to whose folder?
        f"{storage}/r1/",
    ):
        assert place_in(storage, run, recorded) is None, recorded
    (storage / "r1-abcdef").symlink_to(tmp_path / "elsewhere")
    assert place_in(storage, run, str(storage / "r1-abcdef")) is None, "a link in the storage is not a place"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/runs?endpoint_override=USER:s3cret-Tok@minio.example:9000",
        "s3://bucket/runs?endpoint_override=s3cret-Tok@minio.example",
        "s3://bucket/runs?region=x%40s3cret-Tok",
        "abfs://user:s3cret-Tok@account/runs",
    ],
)
def test_a_credential_in_a_storage_option_without_a_scheme_is_refused_unquoted(uri, tmp_path):
    with pytest.raises(SpecError, match=r"target\.storage: .*carries credentials") as e:
        RunSpec.parse({"target": {"cluster": "local", "storage": uri}})
    assert "s3cret-Tok" not in str(e.value)


@pytest.mark.parametrize(
    "uri", ["abfs://container@account/runs", "abfss://container@account.dfs.core.windows.net/runs"]
)
def test_an_azure_container_at_account_is_a_storage_not_a_credential(uri, monkeypatch):
    spec = RunSpec.parse({"target": {"cluster": "local", "storage": uri}})
    assert spec.target.storage == uri
    monkeypatch.setenv(STORAGES_ENV, uri)
    assert storage_trusted(uri + "/r1") and not storage_trusted(uri.replace("container@", "other@") + "/r1")
