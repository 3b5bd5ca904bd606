"""Export a finished run's model to ONNX for inference, and prove it: parity with PyTorch, and latency.

Optimum's ORTTrainer could only dump *training* graphs; what ships is an inference model. ortlab exports the
trained model with its task head (dynamic batch and sequence axes), runs it with onnxruntime on the run's own
eval samples next to PyTorch, and reports the largest absolute difference of the logits and how often the
predictions agree. An export whose parity check fails says so and is not marked good (`export.json`:
`"good": false`). Optionally, ORT's graph optimizations and dynamic int8 quantization, with the accuracy change.

    <run>/onnx/model.onnx           the exported model (opset 17)
    <run>/onnx/model.opt.onnx       with ORT graph optimizations applied offline (--optimize)
    <run>/onnx/model.int8.onnx      dynamic int8 quantization of the weights (--quantize)
    <run>/onnx/export.json          parity, agreement, latency, and which files are good
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# A float32 export of the same graph differs from PyTorch by rounding only; more than this is a broken export.
MAX_ABS_DIFF = 1e-3
MIN_AGREEMENT = 0.99


class ExportError(RuntimeError):
    """The run cannot be exported (not finished, no model); the message says why."""


@dataclass
class Variant:
    """One ONNX file and how it compares with PyTorch on the eval samples."""

    file: str
    max_abs_diff: float
    agreement: float
    accuracy: float | None
    latency_ms: dict[str, float]
    good: bool


@dataclass
class ExportReport:
    run_dir: str
    task: str
    samples: int
    pytorch_latency_ms: dict[str, float]
    pytorch_accuracy: float | None
    variants: dict[str, Variant] = field(default_factory=dict)

    @property
    def good(self) -> bool:
        return bool(self.variants) and self.variants["fp32"].good

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "good": self.good}


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


def _eval_batch(run: Any, tokenizer: Any, n: int) -> tuple[dict[str, Any], Any]:
    """Up to `n` eval rows of the run's own data, tokenized and padded, and their labels (or None)."""
    import torch

    from ortlab.data import load_and_check, tokenize

    spec = run.spec()
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    if spec.task != "causal-lm":  # causal LM rows are lines, packed into blocks: select after tokenizing
        prepared.eval = prepared.eval.select(range(min(n, len(prepared.eval))))
    prepared.train = prepared.eval  # tokenize() works on both splits; only eval is used here
    _, evaluation = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length)
    rows = [evaluation[i] for i in range(min(n, len(evaluation)))]
    padded = tokenizer.pad([{k: r[k] for k in ("input_ids", "attention_mask")} for r in rows], return_tensors="pt")
    labels = None
    if spec.task != "causal-lm":
        width = padded["input_ids"].shape[1]
        if spec.task == "sequence-classification":
            labels = torch.tensor([r["labels"] for r in rows])
        else:
            labels = torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in rows])
    return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}, labels


def _agreement(a: Any, b: Any, mask: Any, task: str) -> float:
    same = a.argmax(-1) == b.argmax(-1)
    if task == "sequence-classification":
        return float(same.float().mean())
    m = mask.bool()
    return float(same[m].float().mean())


def _accuracy(logits: Any, labels: Any) -> float | None:
    if labels is None:
        return None
    preds = logits.argmax(-1)
    keep = labels != -100
    return float((preds[keep] == labels[keep]).float().mean())


def _time_ms(fn: Any, repeats: int = 10) -> float:
    fn()  # warm-up (allocations, first-run kernel selection)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def export_onnx(
    run: Any, samples: int = 64, optimize: bool = False, quantize: bool = False, batch_sizes: tuple[int, ...] = (1, 16)
) -> ExportReport:
    """Export `run` (a Run, RunDir or run folder) to ONNX, check parity and latency; write <run>/onnx/.

    What torch, onnxruntime and DeepSpeed print meanwhile (tracer warnings, CUDA notes) goes to the run's
    logs/run.log, not to the notebook or the terminal: the report says what matters."""
    from ortlab.runner.rundir import RunDir
    from ortlab.train.terminal import captured_output, no_progress_bars

    folder = RunDir(getattr(run, "path", run))
    if not folder.path.is_dir():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes)  # not a run: it says so
    with captured_output(folder.log_path), no_progress_bars():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes)


def _export_onnx(run: Any, samples: int, optimize: bool, quantize: bool, batch_sizes: tuple[int, ...]) -> ExportReport:
    import numpy as np
    import onnxruntime as ort
    import torch

    from ortlab.runner.rundir import RunDir
    from ortlab.tasks import load_model, load_tokenizer

    run = RunDir(getattr(run, "path", run))
    status = run.status()
    if status.get("state") != "completed" or not (run.model_dir / "config.json").exists():
        raise ExportError(f"run {run.id} is {status.get('state')}: only a completed run has a model to export")
    spec = run.spec()
    result = run.result() or {}
    tokenizer = load_tokenizer(str(run.model_dir))
    model = load_model(str(run.model_dir), spec.task, result.get("label_names") or [])
    model.eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")  # exports on every opset; SDPA's export varies with versions
    inputs, labels = _eval_batch(run, tokenizer, samples)
    wrapper = _logits_only(model).eval()

    out = run.path / "onnx"
    tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=run.path))
    try:
        fp32 = tmp / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                (inputs["input_ids"][:2], inputs["attention_mask"][:2]),
                str(fp32),
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch", 1: "sequence"} if spec.task != "sequence-classification" else {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
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
        for name, path in files.items():
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            logits = torch.from_numpy(session.run(["logits"], feeds)[0])
            diff = float((logits - reference).abs().max())
            agreement = _agreement(logits, reference, inputs["attention_mask"], spec.task)
            latency = {
                f"batch_{b}": _time_ms(lambda b=b, s=session: s.run(["logits"], {k: v[:b] for k, v in feeds.items()}))
                for b in sizes
            }
            # int8 changes the numbers on purpose: it is judged by agreement, the fp32 files by both.
            good = agreement >= MIN_AGREEMENT and (name == "int8" or diff <= MAX_ABS_DIFF)
            report.variants[name] = Variant(path.name, diff, agreement, _accuracy(logits, labels), latency, good)

        (tmp / "export.json").write_text(json.dumps(report.to_dict(), indent=2))
        # The folder appears whole, with its report, or not at all; a previous export stays in place until the
        # new one is complete (moved aside, then removed), so a failed re-export loses nothing.
        old = out.with_name(f".onnx-old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report
