"""The user's mark on the run folders they launched, and what a folder without it may not do (issue #48).

A folder the user launched resumes as launched; a folder from elsewhere is gated, and its Hub downloads go without
the user's token unless they say to send it. Fast: the run processes are not started (`_start` or `Popen` record
what they were given), but the last test asks the real huggingface_hub client what it would send.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ortlab.runner as runner
from ortlab.envvars import WITHOUT_HUB_TOKEN
from ortlab.runfolder import vouch
from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run, RunError
from ortlab.spec import RunSpec


@pytest.fixture
def started(monkeypatch) -> list[dict]:
    """Launches and resumes get as far as starting the run process, which records its arguments instead."""
    calls: list[dict] = []
    monkeypatch.setattr(runner, "preflight", lambda spec, launcher=None: {})
    monkeypatch.setattr(runner, "_start", lambda run, spec, **kw: calls.append({"spec": spec, **kw}))
    return calls


def _stopped_with_a_checkpoint(run: RunDir) -> RunDir:
    run.set_status("stopped", step=3)
    (run.checkpoints / "checkpoint-3").mkdir(parents=True)
    (run.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    return run


def test_a_launched_folder_carries_the_users_mark_and_no_copy_or_edit_of_it_does(tmp_path, started, monkeypatch):
    run = runner.launch({"name": "mine", "output_dir": str(tmp_path / "runs")}).dir
    assert vouch.marked(run)
    key = Path(os.environ["ORTLAB_CACHE_DIR"]) / "keys" / vouch.KEY_FILE
    assert oct(key.stat().st_mode & 0o777) == "0o600" and oct(key.parent.stat().st_mode & 0o777) == "0o700"

    copy = RunDir(shutil.copytree(run.path, tmp_path / "elsewhere" / "mine"))
    assert not vouch.marked(copy), "the mark, copied with the folder, names the folder it was made for"
    planted = RunDir.create(tmp_path / "planted", RunSpec.from_run(run))
    (planted.path / vouch.MARK_FILE).write_bytes((run.path / vouch.MARK_FILE).read_bytes())
    assert not vouch.marked(planted)
    run.spec_path.write_text(run.spec_path.read_text().replace("mine", "edited"))
    assert not vouch.marked(run), "a spec.yaml edited after the launch is a stranger's"

    other = RunDir.create(tmp_path / "runs", RunSpec(name="other-user"))
    runner.launch({"name": "again", "output_dir": str(tmp_path / "runs")})
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "another-key"))
    again = RunDir(tmp_path / "runs" / "again")
    assert not vouch.marked(again) and not vouch.marked(other), "another user's (or machine's) key"


def test_a_vouched_folder_resumes_as_launched_and_a_strangers_is_gated(tmp_path, started, monkeypatch):
    """The interpreter the user named at the launch is theirs on resume too; the same spec in a folder they did not
    launch is refused, as before; and only the vouched resume sends the Hub token."""
    monkeypatch.delenv("ORTLAB_TRUSTED_PYTHONS", raising=False)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)  # (a Python of the user's that is neither this one nor a runtime)
    spec = {"name": "mine", "output_dir": str(tmp_path / "runs"), "target": {"python": str(python)}}
    mine = _stopped_with_a_checkpoint(runner.launch(spec).dir)
    Run(mine.path).resume()
    assert started[-1]["resume"] is True and started[-1]["hub_token"] is True
    assert str(started[-1]["spec"].target.python) == str(python)

    planted = _stopped_with_a_checkpoint(RunDir.create(tmp_path / "planted", RunSpec.from_run(mine)))
    with pytest.raises(RunError, match="does not start a program that a run folder names"):
        Run(planted.path).resume()
    Run(planted.path).resume(python=sys.executable)  # named here: it starts, without the token
    assert started[-1]["hub_token"] is False
    _stopped_with_a_checkpoint_again(planted)
    Run(planted.path).resume(python=sys.executable, hub_token=True)
    assert started[-1]["hub_token"] is True


def _stopped_with_a_checkpoint_again(run: RunDir) -> None:
    run.set_status("stopped", step=3)


def test_a_strangers_folder_starts_its_run_without_the_hub_token(tmp_path, monkeypatch):
    """The environment the run process is given (Popen records it): the token's variables emptied and the client's
    implicit token off for a folder the user did not launch; untouched with `hub_token=True`."""
    import ortlab.runner.local as local

    monkeypatch.setattr(runner, "preflight", lambda spec: {})
    monkeypatch.setenv("HF_TOKEN", "hf_the_users_token")
    given: list[dict] = []

    real = subprocess.Popen

    def popen(cmd, env=None, **kwargs):
        if "ortlab.lifecycle" not in cmd:
            return real(cmd, env=env, **kwargs)
        given.append(env)
        raise OSError("recorded, not started")

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    planted = _stopped_with_a_checkpoint(RunDir.create(tmp_path / "runs", RunSpec(name="planted")))
    for hub_token in (False, True):  # (the first ends the run `failed`, which resumes again)
        with pytest.raises(RunError, match="recorded, not started"):
            Run(planted.path).resume(hub_token=hub_token)
    without, with_ = given
    assert {k: without[k] for k in WITHOUT_HUB_TOKEN} == WITHOUT_HUB_TOKEN
    assert with_["HF_TOKEN"] == "hf_the_users_token" and "HF_HUB_DISABLE_IMPLICIT_TOKEN" not in with_
    assert planted.log_path.read_text().count("go without your Hugging Face token") == 1, "the log says so, once"


@pytest.mark.parametrize("withheld", [False, True])
def test_the_hub_client_sends_no_token_in_that_environment(tmp_path, withheld):
    """What the real huggingface_hub would put in a request's headers, in a fresh process with that environment,
    a token both in HF_TOKEN and saved in HF_HOME (as `hf auth login` does)."""
    home = tmp_path / "hf"
    home.mkdir()
    (home / "token").write_text("hf_the_saved_token")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HOME=str(home), HF_TOKEN="hf_the_users_token")
    env.update(WITHOUT_HUB_TOKEN if withheld else {})
    code = "from huggingface_hub.utils import build_hf_headers; print(build_hf_headers().get('authorization'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("None" if withheld else "Bearer hf_the_users_token")


def test_a_key_that_cannot_be_kept_safely_costs_a_prompt_not_the_launch(tmp_path, started, monkeypatch):
    """The keys folder is another user's or open to others (here: open to all): the launch goes on, unmarked, with
    a warning; its resume is gated as a stranger's folder."""
    cache = tmp_path / "cache"
    (cache / "keys").mkdir(parents=True)
    (cache / "keys").chmod(0o777)
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    with pytest.warns(UserWarning, match="not marked as yours"):
        run = runner.launch({"name": "mine", "output_dir": str(tmp_path / "runs")}).dir
    assert run.read_status()["state"] == "pending" and not vouch.marked(run)
    assert not (cache / "keys" / vouch.KEY_FILE).exists(), "no key written into a folder others can write to"
