"""`export_gguf`: a finished causal-LM run to GGUF files and an Ollama Modelfile, each file proven against the trained
model before it is marked good.

What is compared, per GGUF type, on held-out prompts (the run's own eval rows: conversations cut before the
assistant's answer and rendered with the chat template, or raw text lines; a preference run's pairs give their
prompts, `Task.lm_rows`):

- the file read back by transformers (`from_pretrained(folder, gguf_file=...)`, which dequantizes every tensor to
  fp32: the numbers compared are the file's, not a runtime's kernels), its tokenizer and chat template included:
  the prompts must tokenize to the same ids, the template must be the same text;
- the logits over each prompt: max and mean |difference| against the trained model (fp32, LoRA merged), and how
  often the next-token argmax agrees;
- greedy continuations of each prompt (`MAX_NEW_TOKENS`): how many are identical; for one that differs, where it
  first differs and the trained model's margin there between its token and the file's. A difference is
  *explained* when that margin is within the type's tolerance (a near tie that rounding can flip).

A type passes when the tokenizer and template match, the max logit difference is within `TOLERANCE[type]`, and
every differing continuation is explained. A failed type's file stays in the run folder for inspection, marked
failed in the report, and is not published (`ortlab.publish` stages only the good ones).

    <run>/gguf/model.<type>.gguf   the model, one file per type
    <run>/gguf/Modelfile           for `ollama create`, FROM the first good file (ChatML templates only)
    <run>/gguf/export.json         the report
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from ortlab import safeio
from ortlab.export.gguf import QUANTS, check_supported, write_gguf
from ortlab.export.modelfile import is_chatml, modelfile
from ortlab.export.parity import ExportError
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec
from ortlab.tasks import NAMES, get_task

# Max |logit difference| against the trained fp32 model, per type. Measured on SmolLM2-135M (vocab 49,152) after a
# LoRA run, 20 held-out chat prompts (benchmarks/results/gguf-2026-11-28.json): f16 0.056, bf16 0.52, q8_0 3.64, with
# greedy continuations 20/20 identical for all three. q8_0's first bound (2.0, set from one prompt) failed there: the
# max over ~10^8 logits is a tail statistic for an 8-bit type (its mean was 0.15, next-token agreement 98%), so it
# is now 5.0. A wrong layout or token id moves the logits of every position, not the tail (see docs/decisions/gguf.md).
TOLERANCE = {"f16": 0.1, "bf16": 0.6, "q8_0": 5.0}
PROMPTS = 20
MAX_NEW_TOKENS = 24
MAX_PROMPT_TOKENS = 256
LLAMA_CPP_PYTHON = (
    "not run: llama-cpp-python has no prebuilt wheel on PyPI (only an sdist that builds llama.cpp from C++ with "
    "scikit-build-core and CMake), so it does not install here without a compiler toolchain"
)


@dataclass
class GgufVariant:
    """One GGUF file and how it compares with the trained model."""

    file: str
    size_bytes: int
    tensor_types: dict[str, int]
    tolerance: float
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    next_token_agreement: float
    prompts_identical: int
    prompts: int
    differ: list[dict[str, Any]]
    tokenizer_identical: int
    chat_template_identical: bool
    good: bool


@dataclass
class GgufReport:
    run_dir: str
    prompts_from: str
    max_new_tokens: int
    reader: str
    variants: dict[str, GgufVariant] = field(default_factory=dict)
    other_readers: dict[str, str] = field(default_factory=lambda: {"llama-cpp-python": LLAMA_CPP_PYTHON})
    modelfile: str | None = None
    modelfile_note: str | None = None

    @property
    def good(self) -> bool:
        return bool(self.variants) and all(v.good for v in self.variants.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "good": self.good}


def held_out_prompts(run: RunDir, tokenizer: Any, n: int) -> tuple[list[str], str]:
    """(prompts, where they come from): the first `n` usable rows of the run's eval split, as the model sees them;
    for a task whose rows are not plain LM rows (preference pairs), the prompts its `lm_rows` gives."""
    from ortlab.chat import prompts_for
    from ortlab.data import load_and_check

    spec = RunSpec.from_run(run)
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    if spec.task_record.lm_rows:  # rows of another shape (preference pairs): the task gives their prompts
        rows = spec.task_record.part("lm_rows")(prepared, tokenizer, spec.hyper.max_length, n)
        texts = [r["prompt"] for r in rows]
        source = f"eval split: the prompts of {len(texts)} {spec.task} rows, chat template applied with the generation"
        return texts, source + " prompt"
    rows = prepared.eval.select(range(min(len(prepared.eval), 20 * n)))
    if prepared.messages_column or prepared.prompt_column:
        if prepared.messages_column:
            conversations, _ = prompts_for(None, list(rows[prepared.messages_column]), n)
        else:
            conversations = [[{"role": "user", "content": p}] for p in rows[prepared.prompt_column][:n]]
        if tokenizer.chat_template:
            render = tokenizer.apply_chat_template
            texts = [render(c, tokenize=False, add_generation_prompt=True) for c in conversations]
        else:
            texts = [c[-1]["content"] for c in conversations]
        return texts, f"eval split: {len(texts)} conversations, chat template applied with the generation prompt"
    texts = [t.strip() for t in rows[prepared.text_column] if len(str(t).split()) >= 3][:n]
    return texts, f"eval split: the first {len(texts)} text rows of 3 words or more"


def _end_ids(tokenizer: Any) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for marker in ("<|im_end|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


class _Reference:
    """The trained model's side of the comparison: prompt ids, logits and greedy continuations, computed once."""

    def __init__(self, model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int):
        import torch

        self.model, self.tokenizer, self.prompts, self.end = model, tokenizer, prompts, _end_ids(tokenizer)
        encoded = [tokenizer(p, add_special_tokens=False, return_tensors="pt").input_ids for p in prompts]
        self.ids = [ids[:, -MAX_PROMPT_TOKENS:] for ids in encoded]
        with torch.no_grad():
            self.logits = [model(ids).logits[0] for ids in self.ids]
        self.continuations = [greedy(model, ids, max_new_tokens, self.end, tokenizer.pad_token_id) for ids in self.ids]

    def margin(self, prompt: int, at: int, theirs: int) -> float:
        """The trained model's logit for its own greedy token at step `at` minus its logit for `theirs`."""
        import torch

        ours = self.continuations[prompt]
        ids = torch.cat([self.ids[prompt], torch.tensor([ours[:at]], dtype=torch.long)], dim=1)
        with torch.no_grad():
            last = self.model(ids).logits[0, -1]
        return float(last[ours[at]] - last[theirs])


def greedy(model: Any, ids: Any, max_new_tokens: int, end: list[int], pad: int | None) -> list[int]:
    """The greedy continuation of one prompt (no padding: one row), stopping at an end-of-turn token."""
    import torch

    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=end,
            pad_token_id=pad if pad is not None else end[0],
        )
    return out[0, ids.shape[1] :].tolist()


def compare(ref: _Reference, folder: Path, name: str, quant: str, counts: dict[str, int]) -> GgufVariant:
    """Read `folder/name` back with transformers and hold it against the trained model (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"}):  # the GGUF reader's own tqdm bar
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32).eval()
    same_ids = sum(
        tokenizer(t, add_special_tokens=False).input_ids[-MAX_PROMPT_TOKENS:] == ids[0].tolist()
        for t, ids in zip(ref.prompts, ref.ids, strict=True)
    )
    diffs, means, agree, total = [], [], 0, 0
    with torch.no_grad():
        for ids, reference in zip(ref.ids, ref.logits, strict=True):
            logits = model(ids).logits[0]
            delta = (logits - reference).abs()
            diffs.append(float(delta.max()))
            means.append(float(delta.mean()))
            agree += int((logits.argmax(-1) == reference.argmax(-1)).sum())
            total += logits.shape[0]
    tolerance = TOLERANCE[quant]
    differ = []
    for i, ids in enumerate(ref.ids):
        theirs = greedy(model, ids, len(ref.continuations[i]) or 1, ref.end, ref.tokenizer.pad_token_id)
        ours = ref.continuations[i]
        if theirs[: len(ours)] == ours:
            continue
        common = min(len(ours), len(theirs))
        at = next((k for k in range(common) if ours[k] != theirs[k]), common)
        margin = ref.margin(i, at, theirs[at]) if at < common else float("nan")
        differ.append({"prompt": i, "first_diff_at": at, "trained_margin": margin, "explained": margin <= tolerance})
    max_diff = max(diffs)
    template_same = (tokenizer.chat_template or None) == (ref.tokenizer.chat_template or None)
    good = same_ids == len(ref.ids) and template_same and max_diff <= tolerance and all(d["explained"] for d in differ)
    return GgufVariant(
        file=name,
        size_bytes=(folder / name).stat().st_size,
        tensor_types=counts,
        tolerance=tolerance,
        max_abs_logit_diff=max_diff,
        mean_abs_logit_diff=sum(means) / len(means),
        next_token_agreement=agree / total,
        prompts_identical=len(ref.ids) - len(differ),
        prompts=len(ref.ids),
        differ=differ,
        tokenizer_identical=same_ids,
        chat_template_identical=template_same,
        good=good,
    )


def _trained(run: RunDir) -> tuple[Any, Any]:
    """(model, tokenizer) as the run trained them: an adapter merged into its base (GGUF has no adapters here)."""
    from ortlab.tasks import load_model, load_tokenizer

    if (run.model_dir / "adapter_config.json").exists():
        merged = run.model_dir / "merged"
        if (merged / "config.json").exists():
            model = load_model(str(merged), "causal-lm", [])
        else:
            from ortlab.adapters import load_merged

            model = load_merged(str(run.model_dir), "causal-lm", [])
    else:
        model = load_model(str(run.model_dir), "causal-lm", [])
    import torch

    return model.to(torch.float32).eval(), load_tokenizer(str(run.model_dir))


def _checked_run(run: Any) -> RunDir:
    run = RunDir(getattr(run, "path", run))
    status = run.status()
    has_model = (run.model_dir / "config.json").exists() or (run.model_dir / "adapter_config.json").exists()
    if status.get("state") != "completed" or not has_model:
        raise ExportError(f"run {run.id} is {status.get('state')}: only a completed run has a model to export")
    task = RunSpec.from_run(run).task_record
    if "gguf" not in task.exports:
        can = ", ".join(t for t in NAMES if "gguf" in get_task(t).exports)
        raise ExportError(
            f"run {run.id}: GGUF export is for causal LMs (the tasks that export to GGUF: {can}), not a {task.name} "
            "run" + ("; export it to ONNX (`ortlab export`)" if "onnx" in task.exports else "")
        )
    if foreign := run.model_not_own():
        raise ExportError(
            f"run {run.id}: {', '.join(foreign)}. Export loads only the run folder's own regular files: replace each "
            "with the file itself"
        )
    return run


def export_gguf(
    run: Any, quant: str | list[str] = "q8_0", prompts: int = PROMPTS, max_new_tokens: int = MAX_NEW_TOKENS
) -> GgufReport:
    """Export `run` (a Run, RunDir or run folder) to GGUF (one file per type in `quant`), check each against the
    trained model, write an Ollama Modelfile; put <run>/gguf/ in place whole. Library output goes to the run log."""
    from ortlab.train.terminal import captured_output, no_progress_bars

    quants = [quant] if isinstance(quant, str) else list(dict.fromkeys(quant))
    if unknown := [q for q in quants if q not in QUANTS]:
        raise ExportError(f"unknown GGUF type {', '.join(unknown)}: choose from {', '.join(QUANTS)}")
    folder = _checked_run(run)
    with captured_output(folder.log_path), no_progress_bars():
        return _export(folder, quants, prompts, max_new_tokens)


def _export(run: RunDir, quants: list[str], n_prompts: int, max_new_tokens: int) -> GgufReport:
    import transformers

    model, tokenizer = _trained(run)
    check_supported(model.config)
    prompts, source = held_out_prompts(run, tokenizer, n_prompts)
    if not prompts:
        raise ExportError(f"run {run.id}: its eval split has no rows to check the export on")
    ref = _Reference(model, tokenizer, prompts, max_new_tokens)
    report = GgufReport(
        run_dir=str(run.path),
        prompts_from=source,
        max_new_tokens=max_new_tokens,
        reader=f"transformers {transformers.__version__} (GGUF dequantized to fp32)",
    )
    tmp = Path(tempfile.mkdtemp(prefix=".gguf-", dir=run.path))
    try:
        for quant in quants:
            name = f"model.{quant}.gguf"
            counts = write_gguf(model, tokenizer, tmp / name, quant, run.id)
            report.variants[quant] = compare(ref, tmp, name, quant, counts)
        good = [v.file for v in report.variants.values() if v.good]
        report.modelfile_note = is_chatml(tokenizer) if good else "no GGUF file passed its parity check"
        if good and report.modelfile_note is None:
            params = {"temperature": 0.0}  # greedy, as the parity check and ortlab's evaluation decode
            text = modelfile(good[0], tokenizer, model.config.max_position_embeddings, params)
            (tmp / "Modelfile").write_text(text, encoding="utf-8")
            report.modelfile = "Modelfile"
        (tmp / "export.json").write_text(safeio.dumps(report.to_dict(), indent=2))
        _put_in_place(run, tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def _put_in_place(run: RunDir, tmp: Path) -> None:
    """`tmp` becomes <run>/gguf whole; a previous export is moved aside first and removed after (never followed)."""
    out = run.path / "gguf"
    old = out.with_name(f".gguf-old-{os.getpid()}")
    if os.path.lexists(out):
        out.rename(old)
    tmp.rename(out)
    if old.is_symlink():
        old.unlink()
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)
