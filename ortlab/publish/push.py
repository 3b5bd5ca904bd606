"""Staging and the three destinations: the Hub, a folder, a git remote (see `ortlab.publish`)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Any

from ortlab import safeio
from ortlab.adapters import load_merged
from ortlab.errors import OrtlabError
from ortlab.hub import hub_offline
from ortlab.publish.card import _is_adapter_run, model_card
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec
from ortlab.tasks import load_tokenizer

MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "vocab*", "merges*")
NEVER = ("optimizer.pt", "scheduler.pt", "rng_state*", "training_args.bin", "*.tmp", ".ortlab*")
# Inside checkpoints (only with include_checkpoints) the optimizer state stays, for resuming elsewhere; the
# pickled TrainingArguments never leave: they can hold a Hub token (`hub_token`) and local paths.
NEVER_IN_CHECKPOINTS = ("training_args.bin", "*.tmp", ".ortlab*")
TEXT_SUFFIXES = (".json", ".md", ".txt", ".yaml", ".yml")
LFS_PATTERNS = ("*.safetensors", "*.onnx", "*.bin", "*.gguf")


class PublishError(OrtlabError, RuntimeError):
    """The run cannot be published as asked; the message says what to do."""


class PublishWarning(UserWarning):
    """Something in the run folder was not published: a link, a FIFO or another file that is not a regular file
    inside the folder (a `model/vocab.txt` linked to a private key must not be uploaded)."""


def _completed(run: Any, merged: bool = False):

    run = RunDir(getattr(run, "path", run))
    status = run.status()
    adapter = _is_adapter_run(run)
    if status.get("state") != "completed" or not ((run.model_dir / "config.json").exists() or adapter):
        raise PublishError(f"run {run.id} is {status.get('state')}: only a completed run can be published")
    if merged and not adapter:
        raise PublishError(
            f"run {run.id} trained every weight: it has no adapter to merge; publish it without merged/--merged"
        )
    return run


def _scrub_paths(value: Any) -> Any:
    """JSON data with every absolute local path replaced by its last part (`_name_or_path` and the like)."""
    if isinstance(value, dict):
        return {k: _scrub_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_paths(v) for v in value]
    if isinstance(value, str) and _is_local_path(value):
        return Path(value.rstrip("/")).name
    return value


def _is_local_path(value: str) -> bool:
    if len(value) > 4096 or "\n" in value or not value.startswith(("/", "~/")) or value.count("/") < 2:
        return False
    return value.startswith("~/") or os.path.exists(value) or value.startswith(str(Path.home()))


def _scrub_folder(stage: Path, local: list[str]) -> None:
    """Remove local absolute paths from every text file staged for publishing (JSON by structure, the rest by
    replacing the run's own folders). What cannot be parsed is left as it is."""
    for f in stage.rglob("*"):
        if not f.is_file() or f.suffix not in TEXT_SUFFIXES or f.match("vocab*") or f.match("merges*"):
            continue
        if f.name == "tokenizer.json":  # a vocabulary: its strings are tokens, never paths (and it is large)
            continue
        original = text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".json":
            with suppress(json.JSONDecodeError):
                data = json.loads(text)
                scrubbed = _scrub_paths(data)
                if scrubbed != data:
                    text = json.dumps(scrubbed, indent=2, ensure_ascii=False) + "\n"
        for path in sorted(local, key=len, reverse=True):
            text = text.replace(path, Path(path).name)
        if text != original:
            f.write_text(text, encoding="utf-8")


def _model_file(rel: PurePosixPath) -> bool:
    """A file of the model folder itself (not of a subfolder) that is published."""
    return len(rel.parts) == 1 and _matches(rel.name, MODEL_PATTERNS) and not _matches(rel.name, NEVER)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


@contextmanager
def staged(run: Any, include_checkpoints: bool = False, merged: bool = False):
    """A temporary folder with exactly the files to publish (an adapter run's merged model with `merged`).

    Only regular files inside the run folder are staged (`safeio.copy_files`): a link (`model/vocab.txt` ->
    ~/.ssh/id_rsa), a linked folder, a FIFO is left out and named in a PublishWarning, never followed.
    """
    run = _completed(run, merged)
    with tempfile.TemporaryDirectory(prefix="ortlab-publish-") as tmp:
        stage = Path(tmp)
        source, rel = run.path, "model"
        if merged:
            rel = "model/merged"
            if not safeio.is_regular(run.path / rel / "config.json"):
                # the run did not save it (adapter.save_merged): merge now, into the stage (ours)
                _merge_into(run, stage / ".merged")
                source, rel = stage, ".merged"
        skipped = safeio.copy_files(source, rel, stage, select=_model_file, descend=False)
        if source == stage:
            shutil.rmtree(stage / rel)
        if os.path.lexists(run.path / "onnx"):
            skipped += safeio.copy_files(run.path, "onnx", stage / "onnx")
        if os.path.lexists(run.path / "gguf"):
            skipped += safeio.copy_files(run.path, "gguf", stage / "gguf", select=_good_gguf(run), descend=False)
        if include_checkpoints and os.path.lexists(run.checkpoints):
            keep = lambda p: not any(_matches(part, NEVER_IN_CHECKPOINTS) for part in p.parts)  # noqa: E731
            skipped += safeio.copy_files(run.path, "checkpoints", stage / "checkpoints", select=keep)
        if skipped:
            warnings.warn(
                f"not published from run {run.id} (only regular files inside the run folder are): "
                + "; ".join(skipped),
                PublishWarning,
                stacklevel=3,
            )
        (stage / "README.md").write_text(model_card(run, merged))
        spec = RunSpec.from_run(run)
        local = [str(run.path.resolve()), str(run.path), str(Path.home()), spec.model.name, spec.data.source]
        _scrub_folder(stage, [p for p in local if p.startswith("/") and len(p) > 1])
        yield stage


def _good_gguf(run: Any):
    """Which files of <run>/gguf/ are published: the report, and the GGUF files (with the Modelfile that names one)
    whose parity check passed. A failed file stays on this machine; an unreadable report publishes no model file."""
    report = _read_report(run, "gguf/export.json")
    variants = report.get("variants") if isinstance(report, dict) else None
    good = {v.get("file") for v in (variants or {}).values() if isinstance(v, dict) and v.get("good") is True}
    modelfile = report.get("modelfile") if isinstance(report, dict) else None

    def select(rel: PurePosixPath) -> bool:
        return rel.name == "export.json" or rel.name in good or (bool(good) and rel.name == modelfile == "Modelfile")

    return select


def _read_report(run: Any, rel: str) -> Any:
    try:
        return safeio.read_json(run.path, rel)
    except (OSError, ValueError):
        return None


def _merge_into(run: Any, folder: Path) -> None:
    """The adapter merged into its base, saved into `folder` (ours), with the tokenizer; `run` is a RunDir."""

    if foreign := run.model_not_own():  # (a RunDir: see `staged`)
        raise PublishError(
            f"run {run.id}: {', '.join(foreign)}. Merging loads only the run folder's own regular files (a link "
            "would have it read, and publish, any file of this machine): replace each with the file itself"
        )
    result = run.result() or {}
    model = load_merged(str(run.model_dir), RunSpec.from_run(run).task, result.get("label_names") or [])
    model.save_pretrained(str(folder))
    load_tokenizer(str(run.model_dir)).save_pretrained(str(folder))


def push_to_hub(
    run: Any,
    repo_id: str,
    private: bool = False,
    token: str | None = None,
    overwrite: bool = False,
    include_checkpoints: bool = False,
    merged: bool = False,
) -> str:
    """Create `repo_id` on the Hub and upload the run; returns the commit URL. Checks come before uploading."""

    _completed(run, merged)
    if hub_offline():
        raise PublishError("offline mode is on (HF_HUB_OFFLINE=1): unset it to push, or use push_to_folder")
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = token or get_token()
    if not token:
        raise PublishError("no Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass token=...")
    api = HfApi(token=token)
    try:
        exists = api.repo_exists(repo_id)
        if exists and not overwrite:
            raise PublishError(f"the repo {repo_id} already exists: pass overwrite=True (--overwrite) to push into it")
        api.create_repo(repo_id, private=private, exist_ok=overwrite)
        with staged(run, include_checkpoints, merged) as stage:
            info = api.upload_folder(
                folder_path=str(stage),
                repo_id=repo_id,
                commit_message=f"ortlab: {Path(getattr(run, 'path', run)).name}",
            )
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            raise PublishError("the Hub refused the token (401): check it with `hf auth whoami`") from None
        raise PublishError(f"the Hub refused the push: {e}") from None
    except OSError as e:
        raise PublishError(f"could not reach the Hub: {e}") from None
    return str(getattr(info, "commit_url", info))


def push_to_folder(
    run: Any, folder: str | Path, overwrite: bool = False, include_checkpoints: bool = False, merged: bool = False
) -> Path:
    """Copy what would be published into `folder`."""
    target = Path(folder)
    if target.exists() and any(target.iterdir()):
        if not overwrite:
            raise PublishError(f"{target} is not empty: pass overwrite=True to replace its contents")
        card = target / "README.md"
        if not (card.is_file() and "Fine-tuned with [ortlab]" in card.read_text(errors="replace")):
            # overwrite deletes the folder: only ever one that an earlier push_to_folder wrote
            raise PublishError(
                f"{target} is not empty and was not written by ortlab (no ortlab model card in it): "
                "overwrite only replaces an earlier ortlab publish; choose an empty or new folder"
            )
    with staged(run, include_checkpoints, merged) as stage:
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(stage, target)
    return target


def push_to_git(
    run: Any, remote: str, branch: str = "main", include_checkpoints: bool = False, merged: bool = False
) -> str:
    """Commit what would be published (weights through git-lfs) and push it to `remote`; returns the commit."""
    for tool in ("git", "git-lfs"):
        if shutil.which(tool) is None:
            raise PublishError(f"pushing to a git remote needs {tool}: apt-get install {tool}")

    def git(*args: str, cwd: Path) -> str:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PublishError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
        return proc.stdout.strip()

    if Path(remote).is_dir():
        remote = Path(remote).resolve().as_uri()  # git-lfs only talks to local repositories through file:// URLs
    with staged(run, include_checkpoints, merged) as stage:
        git("init", "-q", "-b", branch, cwd=stage)
        git("lfs", "install", "--local", cwd=stage)
        git("lfs", "track", *LFS_PATTERNS, cwd=stage)
        git("add", "-A", cwd=stage)
        git(
            "-c",
            "user.name=ortlab",
            "-c",
            "user.email=ortlab@localhost",
            "commit",
            "-q",
            "-m",
            f"ortlab: {Path(getattr(run, 'path', run)).name}",
            cwd=stage,
        )
        git("push", "-q", "--", remote, f"HEAD:{branch}", cwd=stage)  # `--`: a remote is never an option
        return git("rev-parse", "HEAD", cwd=stage)
