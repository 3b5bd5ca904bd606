"""Publish a finished run: model, tokenizer, ONNX files and a model card, to the Hub, a folder or a git remote.

What is published is staged first in a temporary folder that holds only what should leave the machine: the
model and tokenizer files, `onnx/` if the run was exported, and a README.md model card that states the base
model, the data, the task, the accelerations that really applied, the throughput measured and the eval
results. Tokens, optimizer states and checkpoints are never included unless asked for (`include_checkpoints`).

- `push_to_hub(run, "user/name")`: the token comes from the usual Hugging Face places (HF_TOKEN, the token saved
  by `hf auth login`) or the `token` argument; offline mode and a missing token fail at once, before any upload.
- `push_to_folder(run, path)`: the same files, for users without the Hub.
- `push_to_git(run, remote)`: the same files committed with git-lfs (weights as LFS objects) and pushed.

A LoRA run (`adapter.kind: lora`) publishes its adapter by default (adapter_model.safetensors, adapter_config.json,
the tokenizer: a few MB that need the base model), or with `merged=True` the merged model (the adapter folded into
the base weights: a plain transformers model); the card says which, and names the base model.
"""

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
from ortlab._version import __version__
from ortlab.adapters import load_merged
from ortlab.chat import read_generations, strip_controls
from ortlab.errors import OrtlabError
from ortlab.hub import offline
from ortlab.runfolder.compare import mfu_text
from ortlab.runfolder.rundir import RunDir
from ortlab.scores import format_scores
from ortlab.spec import RunSpec
from ortlab.tasks import load_tokenizer

MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "vocab*", "merges*")
NEVER = ("optimizer.pt", "scheduler.pt", "rng_state*", "training_args.bin", "*.tmp", ".ortlab*")
# Inside checkpoints (only with include_checkpoints) the optimizer state stays, for resuming elsewhere; the
# pickled TrainingArguments never leave: they can hold a Hub token (`hub_token`) and local paths.
NEVER_IN_CHECKPOINTS = ("training_args.bin", "*.tmp", ".ortlab*")
TEXT_SUFFIXES = (".json", ".md", ".txt", ".yaml", ".yml")
LFS_PATTERNS = ("*.safetensors", "*.onnx", "*.bin")


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


def _is_adapter_run(run: Any) -> bool:
    """Whether the run kept an adapter (LoRA) rather than a whole model; `run` is a Run or a RunDir."""

    return (RunDir(run.path).model_dir / "adapter_config.json").is_file()


def _public(location: str) -> str:
    """A model or data location as it may appear in public: a Hub id as it is, a local path as its last part
    (where a file lives on the machine that trained it is nobody's business, and says who trained it)."""
    if location.startswith("embedded:") or not (location.startswith(("/", "~", ".")) or Path(location).exists()):
        return location
    return f"local:{Path(location.rstrip('/')).name}"


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


def model_card(run: Any, merged: bool = False) -> str:
    """The README.md that goes with the model: what it is, how it was trained, what was measured."""
    spec = RunSpec.from_run(run)
    result = run.result() or {}
    exported = _read_json(run, "onnx/export.json")
    applied = [k for k, v in result.get("accelerations", {}).items() if v.get("applied")]
    requested_not = [k for k, v in result.get("accelerations", {}).items() if v.get("requested") and not v["applied"]]
    summary = result.get("summary", {})
    pipeline = {
        "sequence-classification": "text-classification",
        "token-classification": "token-classification",
        "causal-lm": "text-generation",
        "seq2seq": "text2text-generation",
    }[spec.task]
    data = spec.data.source
    adapter = result.get("adapter") if _is_adapter_run(run) else None
    library = "peft" if adapter and not merged else "transformers"
    meta: dict[str, Any] = {
        "library_name": library,
        "pipeline_tag": pipeline,
        "tags": ["ortlab", "onnxruntime", *(["lora"] if adapter else [])],
    }
    if _public(spec.model.name) == spec.model.name:
        meta["base_model"] = spec.model.name
    if not data.startswith("embedded:") and _public(data) == data:
        meta["datasets"] = [data]

    lines = [
        *front_matter(meta),
        "",
        f"# {card_text(run.id)}",
        "",
        f"Fine-tuned with [ortlab](https://github.com/ortlab/ortlab) {__version__} for **{spec.task}**.",
        "",
        "## Training",
        "",
        f"- base model: {_code(_public(spec.model.name))}",
        f"- data: {_code(_public(data))} ({spec.data.max_train_samples or 'all'} training rows)",
        f"- hyperparameters: learning rate {spec.hyper.learning_rate}, batch size {spec.hyper.batch_size}, "
        f"{spec.hyper.max_steps or spec.hyper.epochs} {'steps' if spec.hyper.max_steps else 'epochs'}, "
        f"max length {spec.hyper.max_length}, seed {spec.seed}",
        f"- accelerations that applied (verified during the run): {card_text(', '.join(applied)) or 'none'}",
    ]
    if adapter:
        at = lines.index("## Training")
        lines[at:at] = _adapter_lines(spec, adapter, merged)
    params = result.get("parameters") or {}
    if params.get("total"):
        lines.append(
            f"- trainable parameters: {params['trainable']:,} of {params['total']:,} "
            f"({100 * params['trainable'] / params['total']:.2f}%); optimizer state "
            f"{params.get('optimizer_state_bytes', 0) / 2**20:.1f} MiB"
        )
    if requested_not:
        lines.append(f"- requested but NOT applied: {card_text(', '.join(requested_not))}")
    lines += _tune_lines(run)
    if summary.get("steady_samples_per_s"):
        lines.append(
            f"- measured throughput: {summary['steady_samples_per_s']:.2f} samples/s, "
            f"{summary.get('steady_tokens_per_s', 0):.0f} tokens/s (steady state, after "
            f"{summary.get('warmup_time_s', 0):.1f} s of warm-up); peak memory {summary.get('peak_mem_mb', 0):.0f} MB "
            f"({summary.get('mem_kind')})"
        )
    if isinstance(summary.get("steady_mfu"), (int, float)):
        lines.append(
            f"- model FLOPs utilisation (MFU): {mfu_text(summary['steady_mfu'])} "
            f"({summary.get('steady_model_tflops_per_s', 0):.2f} model TFLOP/s, steady state, against the matmul peak "
            "measured on the training machine; see ortlab.flops and ortlab.peak)"
        )
    if isinstance(summary.get("max_gpu_mem_reserved_mb"), (int, float)):
        lines.append(
            f"- GPU memory: peak allocated within a step {summary.get('max_gpu_mem_step_peak_mb', 0):.0f} MB, "
            f"reserved {summary['max_gpu_mem_reserved_mb']:.0f} MB"
        )
    lines += ["", "## Evaluation", ""]
    if result.get("eval_before"):
        lines.append(f"- before training: {format_scores(result['eval_before'])}")
    if result.get("eval_after"):
        lines.append(f"- after training: {format_scores(result['eval_after'])}")
    lines += _generation_lines(run)
    if isinstance(exported, dict) and isinstance(exported.get("variants"), dict):
        lines += ["", "## ONNX", ""]
        lines += _onnx_lines(exported["variants"])
    lines.append("")
    return "\n".join(lines)


def _onnx_lines(variants: dict[str, Any]) -> list[str]:
    """One line per exported ONNX variant (export.json is read from the run folder: a malformed one is said)."""
    lines = []
    for name, v in variants.items():
        try:
            lines.append(
                f"- {_code('onnx/' + str(v['file']))} ({card_text(name)}): max |logit diff| vs PyTorch "
                f"{v['max_abs_diff']:.2e}, prediction "
                f"agreement {v['agreement']:.4f}"
                + (
                    f", greedy generation equal to PyTorch's on {v['generation_agreement']:.0%} of inputs"
                    if v.get("generation_agreement") is not None
                    else ""
                )
                + f", {'passed' if v['good'] else 'FAILED'} the parity check"
            )
        except (KeyError, TypeError, ValueError):
            lines.append(f"- {card_text(name)}: its entry in onnx/export.json is not readable")
    return lines


def _represent_str(dumper: Any, value: str) -> Any:
    """A plain one-line word as YAML would write it; anything else (a newline, `---`, `: `) double-quoted."""
    if value and value.isprintable() and value == value.strip() and not value.startswith(("-", "'", '"')):
        return dumper.represent_str(value)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')


def front_matter(meta: dict[str, Any]) -> list[str]:
    """The card's YAML front matter lines (between `---` lines), emitted by a YAML dumper, never by hand: model
    and data names come from the spec, and a newline or `---` in one must stay inside its value instead of
    ending the front matter (or adding keys to it)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, _represent_str)
    text = yaml.dump(meta, Dumper=Dumper, sort_keys=False, width=float("inf"), allow_unicode=True)
    return ["---", *text.rstrip("\n").split("\n"), "---"]


def _code(value: Any, limit: int = 300) -> str:
    """Text as a Markdown inline code span, inert: no line breaks or control characters, and a fence of more
    backticks than any run of them inside (CommonMark), so nothing in it is read as Markdown or HTML."""
    import re

    text = strip_controls(str(value).replace("\r", " ").replace("\n", " "))[:limit]
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _read_json(run: Any, rel: str) -> Any:
    """A JSON file of the run folder (tune.json, onnx/export.json), or None: absent, a link, too large, not JSON."""
    try:
        return safeio.read_json(run.path, rel)
    except (OSError, ValueError):
        return None


_MARKDOWN = set("\\`*_{}[]()#+-.!|<>&~=:")


def card_text(value: Any, limit: int = 300) -> str:
    """Text from data or a model, made inert in a Markdown table cell: every character Markdown or HTML gives a
    meaning to becomes an HTML entity (the Hub renders both), line breaks become <br>."""

    text = strip_controls(str(value).replace("\r\n", "\n").replace("\r", "\n"))[:limit]
    out = "".join(f"&#{ord(c)};" if c in _MARKDOWN else c for c in text)
    return out.replace("\n", "<br>")


def _generation_lines(run: Any) -> list[str]:
    """What the model says to the run's fixed prompts, before and after training (generations.jsonl)."""

    records = read_generations(run.path)
    if not records:
        return []
    last_step = max(r.get("step", 0) for r in records)
    before = {r.get("prompt"): r.get("output") for r in records if r.get("phase") == "before"}
    after = [r for r in records if r.get("phase") == "after"] or [r for r in records if r.get("step") == last_step]
    lines = ["", "## Generations", "", "Greedy answers to fixed prompts (model output, shown as text).", ""]
    lines += ["| prompt | before training | after training | expected |", "|---|---|---|---|"]
    for r in after:
        cells = (r.get("prompt", ""), before.get(r.get("prompt"), ""), r.get("output", ""), r.get("reference") or "")
        lines.append("| " + " | ".join(card_text(c) for c in cells) + " |")
    return lines


def _adapter_lines(spec: Any, adapter: dict[str, Any], merged: bool) -> list[str]:
    base = _public(spec.model.name)
    modules = adapter.get("target_modules") or []
    names = ", ".join(str(m) for m in modules) if isinstance(modules, list) else modules
    # Only what comes from the run folder is made inert; the sentence around it is ortlab's own Markdown.
    what = (
        f"LoRA adapter (rank {card_text(adapter.get('rank'))}, alpha {card_text(adapter.get('alpha'))}, "
        f"on {card_text(names)})"
    )
    if merged:
        return [
            f"This repository holds the **merged model**: a {what} trained on the base model {_code(base)} and folded "
            "into its weights. It loads with transformers alone.",
            "",
        ]
    return [
        f"This repository holds a **{what}**, not a whole model: it needs the base model {_code(base)}. Load it with "
        "`peft.AutoPeftModel.from_pretrained(...)`, or `PeftModel.from_pretrained(base_model, ...)`.",
        "",
    ]


def _tune_lines(run: Any) -> list[str]:
    """The measurement that chose the mix (tune.json), as a table: every candidate and why it lost."""
    tuned = _read_json(run, "tune.json")
    if not isinstance(tuned, dict):
        return []

    def cell(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else "-"

    lines = [
        "",
        f"The mix was chosen by measuring each candidate on this run's model and batches "
        f"({cell(tuned.get('rounds'), 'd')} interleaved rounds, {cell(tuned.get('calibration_s'), '.0f')} s):",
        "",
        "| mix | samples/s | vs plain | warm-up (s) | verdict |",
        "|---|---:|---:|---:|---|",
    ]
    for m in tuned.get("candidates") or []:
        if not isinstance(m, dict):
            continue
        lines.append(
            f"| {card_text(m.get('name'))} | {cell(m.get('samples_per_s'), '.1f')} | {cell(m.get('ratio'), '.2f')} "
            f"| {cell(m.get('warmup_s'), '.1f')} | {card_text(m.get('verdict', ''))} |"
        )
    return lines


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
    if offline():
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
