"""What an export reports and how it is judged: the parity thresholds, one `Variant` per ONNX file, the
`ExportReport` written to `<run>/onnx/export.json`, and the measures (agreement, accuracy, latency) both the
single-graph and the encoder-decoder export use. The report folder is put in place whole (`publish_folder`)."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.errors import OrtlabError
from ortlab.tasks import get_task

# A float32 export of the same graph differs from PyTorch by rounding only; more than this is a broken export.
MAX_ABS_DIFF = 1e-3
MIN_AGREEMENT = 0.99


class ExportError(OrtlabError, RuntimeError):
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
    generation_agreement: float | None = None  # seq2seq: share of greedy outputs equal to PyTorch's


@dataclass
class ExportReport:
    run_dir: str
    task: str
    samples: int
    pytorch_latency_ms: dict[str, float]
    pytorch_accuracy: float | None
    variants: dict[str, Variant] = field(default_factory=dict)
    generation: dict[str, Any] | None = None  # seq2seq: how the generation check was run

    @property
    def good(self) -> bool:
        return bool(self.variants) and self.variants["fp32"].good

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "good": self.good}


def _agreement(a: Any, b: Any, mask: Any, task: str) -> float:
    same = a.argmax(-1) == b.argmax(-1)
    if get_task(task).labels == "row":  # one prediction per sequence
        return float(same.float().mean())
    m = mask.bool()
    return float(same[m].float().mean())


def _accuracy(logits: Any, labels: Any) -> float | None:
    if labels is None:
        return None
    preds = logits.argmax(-1)
    keep = labels != -100
    return float((preds[keep] == labels[keep]).float().mean())


def _publish(run: Any, tmp: Path, report: ExportReport) -> None:
    """Write the report and put `tmp` in place of <run>/onnx: the folder appears whole, with its report, or not at
    all; a previous export stays in place until the new one is complete (moved aside, then removed), so a failed
    re-export loses nothing."""
    (tmp / "export.json").write_text(safeio.dumps(report.to_dict(), indent=2))  # NaN diffs as null: valid JSON
    out = run.path / "onnx"
    old = out.with_name(f".onnx-old-{os.getpid()}")
    if os.path.lexists(out):  # a planted link at onnx/ is moved aside like a folder, never followed
        out.rename(old)
    tmp.rename(out)
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


def _time_ms(fn: Any, repeats: int = 10) -> float:
    fn()  # warm-up (allocations, first-run kernel selection)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)
