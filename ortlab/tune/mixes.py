"""What to measure: the candidate mixes this runtime can train, and why each of the others is not measured.

The list comes from the doctor's static checks (cheap: no probe runs), so planning costs nothing; the
measurement (`ortlab.tune.measure`) then trains only the candidates with no `skipped` reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortlab import runtimes
from ortlab.accel import fused_adam, ort, precision, torch_compile
from ortlab.accel.mix import _cuda_available


@dataclass
class MixCandidate:
    """One mix to measure. `python` is the interpreter it runs in (a compile runtime for torch.compile)."""

    name: str
    ort: bool = False
    fused_adam: bool = False
    precision: str = "fp32"
    torch_compile: bool = False
    python: str | None = None
    skipped: str | None = None  # why it is not measured here (not available, known to be emulated, ...)
    reference: bool = False  # plain transformers.Trainer, measured for the table, never chosen (ortlab.tune.share)

    def choice(self) -> dict[str, Any]:
        return {
            "ort": self.ort,
            "fused_adam": self.fused_adam,
            "precision": self.precision,
            "torch_compile": self.torch_compile,
        }


def candidate_mixes(processes: int = 1, use_cpu: bool = False, compile: bool = False) -> list[MixCandidate]:
    """The candidate mixes for this runtime, from the doctor's static checks (cheap; no probes run).

    torch.compile is measured only when asked (`compile=True`, `ortlab tune --compile`): its warm-up (about a
    minute on CPU, again for each new batch shape) is larger than the whole calibration budget, it moves the run
    to another runtime, and `accel.torch_compile` is never 'auto' (a user turns it on knowingly).
    """
    cuda = _cuda_available() and not use_cpu
    ort_ok, fused_ok = ort.availability(), fused_adam.availability()
    out = [MixCandidate("plain")]
    out.append(MixCandidate("fused_adam", fused_adam=True, skipped=None if fused_ok.available else fused_ok.reason))
    # ORT is measured with fused AdamW where that exists: the optimizer step is outside ORT's graph, so fused
    # AdamW's gain adds to ORT's as it adds to plain PyTorch's, and one ORT export fewer keeps the calibration
    # near its 60 s budget on 2 cores. Without fused AdamW, ORT is measured alone.
    ort_why = None if ort_ok.available else ort_ok.reason
    if fused_ok.available:
        separately = "not measured: fused AdamW is independent of ORT's graph; ort+fused_adam measures ORT"
        out.append(MixCandidate("ort", ort=True, skipped=ort_why or separately))
        out.append(MixCandidate("ort+fused_adam", ort=True, fused_adam=True, skipped=ort_why))
    else:
        out.append(MixCandidate("ort", ort=True, skipped=ort_why))
        out.append(MixCandidate("ort+fused_adam", ort=True, fused_adam=True, skipped=ort_why or fused_ok.reason))
    bf16_why = bf16_skipped(cuda)
    out.append(MixCandidate("bf16+fused_adam", fused_adam=fused_ok.available, precision="bf16", skipped=bf16_why))
    if cuda:
        out.append(MixCandidate("fp16+fused_adam", fused_adam=fused_ok.available, precision="fp16"))
    compiled = torch_compile.availability()
    compile_python = None if compiled.available else _compile_runtime()
    if not compile:
        why = "not measured: its warm-up exceeds the calibration budget; `ortlab tune --compile` measures it"
        out.append(MixCandidate("torch_compile", torch_compile=True, skipped=why))
    elif compiled.available or compile_python:
        out.append(MixCandidate("torch_compile+fused_adam", fused_adam=True, torch_compile=True, python=compile_python))
    else:
        out.append(MixCandidate("torch_compile", torch_compile=True, skipped=compiled.reason))
    if processes > 1:
        for c in out:
            if c.name != "plain" and c.skipped is None:
                c.skipped = "not measured: ortlab tunes single-process runs only (processes > 1)"
    return out


def bf16_skipped(cuda: bool) -> str | None:
    """Why bf16 is not measured here (not available; emulated, so ~10x slower, on a CPU), or None."""
    bf16 = precision.bf16_availability()
    if not bf16.available:
        return bf16.reason
    if bf16.slow and not cuda:
        return f"not measured: {bf16.reason}"
    return None


def _compile_runtime() -> str | None:
    """The interpreter of ortlab's compile runtime (torch >= 2.7), if one was created (`ortlab runtime`)."""
    path = runtimes.python_for("compile")
    return str(path) if path else None
