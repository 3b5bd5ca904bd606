"""The export of a one-graph model (a classifier, a token tagger, a causal LM with or without its KV cache):
tensors in, logits out, run by ONNX Runtime next to PyTorch on the run's own eval rows. A causal LM's graph with
the cache is written by `ortlab.export.kvcache`, and its greedy generations are checked against PyTorch's here
too. An encoder-decoder run is handed to `ortlab.export.encdec`."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from ortlab.data import load_and_check, tokenize
from ortlab.export.encdec import _export_seq2seq
from ortlab.export.kvcache import PAST, cache_names, cache_shape, export_kv, generation_parity, held_out_prompts
from ortlab.export.parity import (
    MAX_ABS_DIFF,
    MIN_AGREEMENT,
    ExportError,
    ExportReport,
    Variant,
    _accuracy,
    _agreement,
    _publish,
    _time_ms,
)
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec
from ortlab.tasks import NAMES, get_task
from ortlab.train.terminal import captured_output, no_progress_bars


def _logits_only(model: Any) -> Any:
    """`model` as export should see it: tensors in, logits out (no dicts, no cache)."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
            ).logits

    return LogitsOnly(model)


def export_logits(model: Any, inputs: dict[str, Any], path: Path, task: str = "causal-lm") -> None:
    """Write `model` as one graph, (input_ids, attention_mask) -> logits, with dynamic batch and sequence axes; a
    causal LM this way has no cache (each call sees the whole sequence). `inputs`: an example batch (2 rows used)."""
    import torch

    with torch.no_grad():
        torch.onnx.export(
            _logits_only(model).eval(),
            (inputs["input_ids"][:2], inputs["attention_mask"][:2]),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                # a label per row (a classifier): one logits row per sequence; else one per token
                "logits": {0: "batch"} if get_task(task).labels == "row" else {0: "batch", 1: "sequence"},
            },
            opset_version=17,
            dynamo=False,
        )


def _eval_batch(run: Any, tokenizer: Any, n: int) -> tuple[dict[str, Any], Any]:
    """Up to `n` eval rows of the run's own data, tokenized and padded, and their labels (or None). A task whose rows
    are not a model's rows (preference pairs) gives them as plain LM rows (`Task.lm_rows`), with no labels to
    compare: as a causal LM's, they are the inputs."""
    import torch

    spec = RunSpec.from_run(run)
    task = spec.task_record
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    if task.lm_rows:  # rows of another shape (preference pairs): the task says which plain LM rows they give
        rows = task.part("lm_rows")(prepared, tokenizer, spec.hyper.max_length, n)
        ids = [{"input_ids": r["input_ids"], "attention_mask": [1] * len(r["input_ids"])} for r in rows]
        padded = tokenizer.pad(ids, return_tensors="pt")
        return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}, None
    if not task.blocks:  # a causal LM's lines may be packed into blocks: select after tokenizing
        prepared.eval = prepared.eval.select(range(min(n, len(prepared.eval))))
    prepared.train = prepared.eval  # tokenize() works on both splits; only eval is used here
    _, evaluation = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length, spec.hyper.max_target_length)
    rows = [evaluation[i] for i in range(min(n, len(evaluation)))]
    # (chat rows carry no attention mask: every token of theirs is attended)
    ids = [{"input_ids": r["input_ids"], "attention_mask": r.get("attention_mask") or [1] * len(r["input_ids"])}
           for r in rows]  # fmt: skip
    padded = tokenizer.pad(ids, return_tensors="pt")
    labels = None
    if task.labels or task.target:  # a causal LM's labels are its inputs: none to compare
        width = padded["input_ids"].shape[1]
        if task.target:  # the target's own length, padded with -100 as the training collator does
            width = max(len(r["labels"]) for r in rows)
        if task.labels == "row":
            labels = torch.tensor([r["labels"] for r in rows])
        else:
            labels = torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in rows])
    return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}, labels


def export_onnx(
    run: Any,
    samples: int = 64,
    optimize: bool = False,
    quantize: bool = False,
    batch_sizes: tuple[int, ...] = (1, 16),
    cache: bool = True,
) -> ExportReport:
    """Export `run` (a Run, RunDir or run folder) to ONNX, check parity and latency; write <run>/onnx/.

    `cache` (causal LMs): the graph takes and returns past key values, so generating costs one short step per
    token (the default: generation is what a causal LM is exported for, and the cache graph also answers a whole
    sequence with an empty past); `cache=False` writes the graph without them, which re-runs the prefix per token.

    What torch, onnxruntime and DeepSpeed print meanwhile (tracer warnings, CUDA notes) goes to the run's
    logs/run.log, not to the notebook or the terminal: the report says what matters."""

    folder = RunDir(getattr(run, "path", run))
    if not folder.path.is_dir():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes, cache)  # not a run: it says so
    with captured_output(folder.log_path), no_progress_bars():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes, cache)


def _export_onnx(
    run: Any, samples: int, optimize: bool, quantize: bool, batch_sizes: tuple[int, ...], cache: bool
) -> ExportReport:
    import numpy as np
    import onnxruntime as ort
    import torch

    from ortlab.tasks import load_model, load_tokenizer

    run = RunDir(getattr(run, "path", run))
    status = run.status()
    adapter = (run.model_dir / "adapter_config.json").exists()
    if status.get("state") != "completed" or not ((run.model_dir / "config.json").exists() or adapter):
        raise ExportError(f"run {run.id} is {status.get('state')}: only a completed run has a model to export")
    if foreign := run.model_not_own():
        raise ExportError(
            f"run {run.id}: {', '.join(foreign)}. Export loads only the run folder's own regular files (a link "
            "would have it read, and write into onnx/, any file of this machine): replace each with the file itself"
        )
    spec = RunSpec.from_run(run)
    if "onnx" not in spec.task_record.exports:
        raise ExportError(
            f"run {run.id}: a {spec.task} run has no ONNX export yet (its parity check needs inputs of that task's "
            f"data); the tasks that export: {', '.join(t for t in NAMES if 'onnx' in get_task(t).exports)}"
        )
    result = run.result() or {}
    tokenizer = load_tokenizer(str(run.model_dir))
    if adapter:
        # An adapter run exports the model it trained: the base with the adapter merged into its weights (ONNX
        # Runtime has no notion of an adapter). model/merged/ when the run saved it, else merged here.
        merged_dir = run.model_dir / "merged"
        if (merged_dir / "config.json").exists():
            model = load_model(str(merged_dir), spec.task, result.get("label_names") or [])
        else:
            from ortlab.adapters import load_merged

            model = load_merged(str(run.model_dir), spec.task, result.get("label_names") or [])
    else:
        model = load_model(str(run.model_dir), spec.task, result.get("label_names") or [])
    model.eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")  # exports on every opset; SDPA's export varies with versions
    inputs, labels = _eval_batch(run, tokenizer, samples)
    if "onnx-encoder-decoder" in spec.task_record.exports:
        tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=run.path))
        try:
            report = _export_seq2seq(run, spec, model, inputs, labels, tmp, optimize, quantize, batch_sizes)
            _publish(run, tmp, report)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return report
    wrapper = _logits_only(model).eval()
    with_cache = cache and spec.task_record.lm_head

    tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=run.path))
    try:
        fp32 = tmp / "model.onnx"
        with torch.no_grad():
            if with_cache:
                export_kv(model, fp32)
                # Beside the graph, what a generation loop needs without the run: end tokens, tokenizer, template.
                model.config.save_pretrained(tmp)
                model.generation_config.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            else:
                export_logits(model, inputs, fp32, spec.task)
            reference = wrapper(**inputs)

        def pytorch_call(batch: dict[str, Any]):
            with torch.no_grad():
                return wrapper(**batch)

        def subset(n: int) -> dict[str, Any]:
            return {k: v[:n] for k, v in inputs.items()}

        sizes = [b for b in batch_sizes if b <= len(inputs["input_ids"])]
        report = ExportReport(
            run_dir=str(run.path),
            task=spec.task,
            samples=len(inputs["input_ids"]),
            pytorch_latency_ms={f"batch_{b}": _time_ms(lambda b=b: pytorch_call(subset(b))) for b in sizes},
            pytorch_accuracy=_accuracy(reference, labels),
        )
        files = {"fp32": fp32}
        if optimize:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.optimized_model_filepath = str(tmp / "model.opt.onnx")
            ort.InferenceSession(str(fp32), options, providers=["CPUExecutionProvider"])
            files["optimized"] = tmp / "model.opt.onnx"
        if quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(fp32), str(tmp / "model.int8.onnx"), weight_type=QuantType.QInt8)
            files["int8"] = tmp / "model.int8.onnx"

        feeds = {k: v.numpy().astype(np.int64) for k, v in inputs.items()}

        def onnx_feeds(b: int) -> dict[str, Any]:
            """The first `b` rows; for the cache graph, a whole sequence is the prefill: positions, empty past."""
            out = {k: v[:b] for k, v in feeds.items()}
            if with_cache:
                width = feeds["input_ids"].shape[1]
                out["position_ids"] = np.broadcast_to(np.arange(width, dtype=np.int64), (b, width)).copy()
                layers, heads, head_dim = cache_shape(model.config)
                out.update({n: np.zeros((b, heads, 0, head_dim), np.float32) for n in cache_names(layers, PAST)})
            return out

        generations: dict[str, tuple[float, float]] = {}
        if with_cache:
            prompts = held_out_prompts(inputs, n=8, length=16)
            max_new = spec.generation.max_new_tokens
            pytorch_ms, generations = generation_parity(
                model, tmp, {name: path.name for name, path in files.items()}, prompts, max_new
            )
            report.pytorch_latency_ms["per_token"] = pytorch_ms
            report.generation = {
                "strategy": "greedy (do_sample=False), no logits processors, one prompt at a time",
                "kv_cache": True,
                "inputs": len(prompts),
                "prompt_tokens": 16,
                "max_new_tokens": max_new,
                "per_token": "milliseconds per generated token, prompt processing included",
            }
        for name, path in files.items():
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            logits = torch.from_numpy(session.run(["logits"], onnx_feeds(len(feeds["input_ids"])))[0])
            diff = float((logits - reference).abs().max())
            agreement = _agreement(logits, reference, inputs["attention_mask"], spec.task)
            latency = {f"batch_{b}": _time_ms(lambda b=b, s=session: s.run(["logits"], onnx_feeds(b))) for b in sizes}
            same, per_token = generations.get(name, (None, None))
            if per_token is not None:
                latency["per_token"] = per_token
            # int8 changes the numbers on purpose: it is judged by agreement, the fp32 files by both (and, with the
            # cache, by generating exactly PyTorch's greedy tokens).
            good = agreement >= MIN_AGREEMENT and (name == "int8" or (diff <= MAX_ABS_DIFF and same in (None, 1.0)))
            accuracy = _accuracy(logits, labels)
            report.variants[name] = Variant(path.name, diff, agreement, accuracy, latency, good, same)

        _publish(run, tmp, report)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report
