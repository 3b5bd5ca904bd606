"""The model card a published run carries: its front matter for the Hub and a README that states the base model,
the data, the task, the accelerations that applied, the measured throughput, the scores and the generations.
Everything from the run folder is escaped as Markdown text (`card_text`): a card is read on the Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab._version import __version__
from ortlab.chat import read_generations, strip_controls
from ortlab.runfolder.compare import mfu_text
from ortlab.runfolder.rundir import RunDir
from ortlab.scores import format_scores
from ortlab.spec import RunSpec


def _is_adapter_run(run: Any) -> bool:
    """Whether the run kept an adapter (LoRA) rather than a whole model; `run` is a Run or a RunDir."""
    return (RunDir(run.path).model_dir / "adapter_config.json").is_file()


def _public(location: str) -> str:
    """A model or data location as it may appear in public: a Hub id as it is, a local path as its last part
    (where a file lives on the machine that trained it is nobody's business, and says who trained it)."""
    if location.startswith("embedded:") or not (location.startswith(("/", "~", ".")) or Path(location).exists()):
        return location
    return f"local:{Path(location.rstrip('/')).name}"


def model_card(run: Any, merged: bool = False) -> str:
    """The README.md that goes with the model: what it is, how it was trained, what was measured."""
    spec = RunSpec.from_run(run)
    result = run.result() or {}
    exported = _read_json(run, "onnx/export.json")
    gguf_report = _read_json(run, "gguf/export.json")
    gguf_good = isinstance(gguf_report, dict) and gguf_report.get("good") is True
    applied = [k for k, v in result.get("accelerations", {}).items() if v.get("applied")]
    requested_not = [k for k, v in result.get("accelerations", {}).items() if v.get("requested") and not v["applied"]]
    summary = result.get("summary", {})
    pipeline = spec.task_record.pipeline_tag
    data = spec.data.source
    adapter = result.get("adapter") if _is_adapter_run(run) else None
    library = "peft" if adapter and not merged else "transformers"
    meta: dict[str, Any] = {
        "library_name": library,
        "pipeline_tag": pipeline,
        "tags": ["ortlab", "onnxruntime", *(["lora"] if adapter else []), *(["gguf"] if gguf_good else [])],
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
    lines += _estimate_lines(result)
    lines += ["", "## Evaluation", ""]
    if result.get("eval_before"):
        lines.append(f"- before training: {format_scores(result['eval_before'])}")
    if result.get("eval_after"):
        lines.append(f"- after training: {format_scores(result['eval_after'])}")
    lines += _generation_lines(run)
    if isinstance(exported, dict) and isinstance(exported.get("variants"), dict):
        lines += ["", "## ONNX", ""]
        lines += _onnx_lines(exported["variants"])
    lines += _gguf_lines(gguf_report, run.id)
    lines.append("")
    return "\n".join(lines)


def _estimate_lines(result: dict[str, Any]) -> list[str]:
    """What `ortlab.estimate` predicted before the run against what the run measured (result.json's "estimate");
    numbers only, as everything read from a run folder."""
    est = result.get("estimate")
    said = []
    for key, what, unit, fmt in (
        ("peak_mem_mb", "peak memory", "MB", "{:.0f}"),
        ("step_time_s", "time per step", "s", "{:.3g}"),
        ("total_time_s", "whole run", "s", "{:.0f}"),
    ):
        pair = est.get(key) if isinstance(est, dict) else None
        p, m = (pair.get("predicted"), pair.get("measured")) if isinstance(pair, dict) else (None, None)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e12 for v in (p, m)):
            off = (p - m) / m
            said.append(f"{what} {fmt.format(p)} {unit} predicted, {fmt.format(m)} {unit} measured ({off:+.0%})")
    return [f"- estimated before the run (`ortlab.estimate`) against measured: {'; '.join(said)}"] if said else []


def _gguf_lines(report: Any, name: str) -> list[str]:
    """How to run the published GGUF files (llama.cpp, Ollama) and how close each is to the trained model. Only the
    files that passed their check are published (`push._good_gguf`); a failed one is named as not published."""
    if not isinstance(report, dict) or not isinstance(report.get("variants"), dict):
        return []
    lines = ["", "## GGUF (llama.cpp, Ollama, LM Studio)", ""]
    good = []
    for quant, v in report["variants"].items():
        try:
            line = (
                f"- {_code('gguf/' + str(v['file']))} ({card_text(quant)}, {v['size_bytes'] / 2**20:.1f} MiB): greedy "
                f"continuations identical to the trained model's on {v['prompts_identical']}/{v['prompts']} held-out "
                f"prompts, max |logit diff| {v['max_abs_logit_diff']:.3g} (tolerance {v['tolerance']:g}), "
            )
            line += "passed the parity check" if v["good"] is True else "FAILED the parity check: not published"
            lines.append(line)
            if v["good"] is True:
                good.append(str(v["file"]))
        except (KeyError, TypeError, ValueError):
            lines.append(f"- {card_text(quant)}: its entry in gguf/export.json is not readable")
    if good:
        tag = _shell_word(name.lower())
        lines += [
            "",
            "Run it with llama.cpp:",
            "",
            "```sh",
            f"llama-cli -m gguf/{_shell_word(good[0])} -cnv",
            "```",
        ]
        if report.get("modelfile") == "Modelfile":
            lines += [
                "",
                "or with Ollama (the Modelfile carries the chat template, stop tokens and parameters):",
                "",
                "```sh",
                f"cd gguf && ollama create {tag} -f Modelfile && ollama run {tag}",
                "```",
            ]
    return lines


def _shell_word(value: str) -> str:
    """A file or model name as one inert shell word in a code block (letters, digits, . _ - only)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "-", value)[:100] or "model"


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
