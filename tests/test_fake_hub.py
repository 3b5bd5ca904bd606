"""FakeHub against the real `huggingface_hub` client.

The client reads HF_ENDPOINT when it is imported, so each test runs it in a subprocess pointed at the FakeHub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_hub import FakeHub

TOKEN = "hf_test_token"
REPO = "ortlab-tests/tiny-model"


@pytest.fixture
def hub():
    with FakeHub(token=TOKEN) as hub:
        yield hub


def run_client(hub: FakeHub, tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `script` with the venv's Python, talking to `hub`; `args` arrive as sys.argv[1:]."""
    env = hub.client_env(tmp_path / "hf_home", token=TOKEN)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_folder(folder: Path) -> dict[str, bytes]:
    """A small model folder: a text file, a README.md and a 200 KB binary weights file (which goes through LFS)."""
    files = {
        "notes.txt": b"trained with ortlab\n",
        "README.md": b"---\nlicense: apache-2.0\n---\n# tiny model\n",
        "model.safetensors": os.urandom(200_000),
    }
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def read_folder(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(folder).parts  # skip snapshot_download's local metadata
    }


def test_upload_folder_then_snapshot_download_round_trips(hub, tmp_path):
    uploaded = make_folder(tmp_path / "up")
    script = """
        import json, sys
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download

        repo_id, up, down = sys.argv[1:]
        api = HfApi()
        url = api.create_repo(repo_id, private=False, exist_ok=False)
        commit = api.upload_folder(folder_path=up, repo_id=repo_id, commit_message="first push")
        info = api.model_info(repo_id)
        snapshot_download(repo_id, local_dir=down)
        cached = hf_hub_download(repo_id, "model.safetensors")  # into the HF_HOME cache this time
        print(json.dumps({
            "url": str(url),
            "commit": commit.oid,
            "exists": api.repo_exists(repo_id),
            "missing_exists": api.repo_exists(repo_id + "-missing"),
            "info_sha": info.sha,
            "repo_info_sha": api.repo_info(repo_id).sha,
            "files": sorted(api.list_repo_files(repo_id)),
            "cached": cached,
        }))
    """
    result = run_client(hub, tmp_path, script, REPO, str(tmp_path / "up"), str(tmp_path / "down"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])

    assert read_folder(tmp_path / "down") == uploaded
    assert Path(out["cached"]).read_bytes() == uploaded["model.safetensors"]
    assert hub.files(REPO) == uploaded
    state = hub.repo(REPO)
    assert state["private"] is False
    assert state["lfs"] == ["model.safetensors"]  # preupload sent the weights through LFS, the text files inline
    assert state["commits"][-1] == "first push"
    assert out["url"] == f"{hub.url}/{REPO}"
    assert out["commit"] == out["info_sha"] == out["repo_info_sha"] == state["sha"]
    assert out["exists"] is True and out["missing_exists"] is False
    assert out["files"] == sorted(uploaded)


def test_create_repo_on_an_existing_repo_without_exist_ok_fails_with_409(hub, tmp_path):
    script = """
        import sys
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(sys.argv[1])
        api.create_repo(sys.argv[1], exist_ok=True)  # fine
        api.create_repo(sys.argv[1], exist_ok=False)  # raises
    """
    result = run_client(hub, tmp_path, script, REPO)
    assert result.returncode != 0
    assert "HfHubHTTPError" in result.stderr and "409" in result.stderr, result.stderr
    assert hub.repo(REPO)["commits"] == ["initial commit"]


def test_upload_with_a_wrong_token_fails_with_401(hub, tmp_path):
    make_folder(tmp_path / "up")
    script = """
        import sys
        from huggingface_hub import HfApi

        repo_id, up = sys.argv[1:]
        HfApi().create_repo(repo_id)
        HfApi(token="hf_wrong_token").upload_folder(folder_path=up, repo_id=repo_id, commit_message="nope")
    """
    result = run_client(hub, tmp_path, script, REPO, str(tmp_path / "up"))
    assert result.returncode != 0
    assert "401" in result.stderr and "Invalid credentials in Authorization header" in result.stderr, result.stderr
    assert hub.files(REPO) == {}


def test_private_repo_is_hidden_from_anonymous_readers(hub, tmp_path):
    make_folder(tmp_path / "up")
    script = """
        import json, sys
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError

        repo_id, up = sys.argv[1:]
        api, anonymous = HfApi(), HfApi(token=False)
        api.create_repo(repo_id, private=True)
        api.upload_folder(folder_path=up, repo_id=repo_id, commit_message="secret")
        try:
            anonymous.create_repo(repo_id + "-2")
            anonymous_create = "ok"
        except HfHubHTTPError as e:
            anonymous_create = e.response.status_code
        try:
            hf_hub_download(repo_id, "notes.txt", token=False)
            anonymous_download = "ok"
        except Exception as e:
            anonymous_download = type(e).__name__
        print(json.dumps({
            "anonymous_exists": anonymous.repo_exists(repo_id),
            "exists": api.repo_exists(repo_id),
            "private": api.model_info(repo_id).private,
            "anonymous_create": anonymous_create,
            "anonymous_download": anonymous_download,
            "notes": open(hf_hub_download(repo_id, "notes.txt")).read(),
        }))
    """
    result = run_client(hub, tmp_path, script, REPO, str(tmp_path / "up"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {
        "anonymous_exists": False,
        "exists": True,
        "private": True,
        "anonymous_create": 401,
        "anonymous_download": "RepositoryNotFoundError",
        "notes": "trained with ortlab\n",
    }
    assert hub.repo(REPO)["private"] is True
