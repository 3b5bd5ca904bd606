"""Know before Launch: a run's peak memory, time and cost, from its spec alone, in about a second.

    est = ortlab.estimator(spec)                 # this machine; or device="H100 SXM" for a GPU on paper
    est.peak, est.step, est.total, est.cost     # each a Term: value, low-high range, and what it rests on
    print(est.table())                          # what `ortlab estimate` prints

Nothing heavy is touched: the model's config.json and its safetensors header (`model`), a sample of the data's rows
tokenized by `tokenizers` (`lengths`), the matmul peak this machine measured before (`timing.cpu_peak`) and what
runs here taught (`calibration`). No torch, no transformers, no weights. The arithmetic is in `memory` and
`timing`; `fits` turns an estimate into a refusal with remedies, for the launch's preflight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.accel import tcmalloc
from ortlab.errors import OrtlabError
from ortlab.estimator import calibration
from ortlab.estimator.gpus import Gpu, gpu
from ortlab.estimator.lengths import Lengths, sample_lengths
from ortlab.estimator.memory import CUDA_CONTEXT_MB, Setup, memory_terms, optimizer_variant
from ortlab.estimator.model import ModelFactsError, model_folder, read_model
from ortlab.estimator.terms import ASSUMED, CALIBRATED, FORMULA, MEASURED, Term, term, total
from ortlab.estimator.timing import EFFICIENCY, GPU_EFFICIENCY, cpu_peak, eval_seconds, startup_term, step_terms
from ortlab.flops import ModelShape
from ortlab.tasks import get_task

__all__ = ["Estimate", "EstimateError", "Term", "as_spec", "estimate", "local_gpu_name"]


class EstimateError(OrtlabError, ValueError):
    """The spec cannot be estimated here (its model's config is not on this machine, say); the message says why."""


# A run teaches the matmul efficiency only where the matmuls are at least this share of its predicted step: where
# they are less (a tiny model's step is Python and kernel launches), the step less the other terms is a small
# difference of two larger numbers, and an efficiency learned from it was anything from 0.05 to well over 1
# (a tiny BERT on a quiet machine), and would have set the next MiniLM run's prediction.
LEARN_COMPUTE_SHARE = 0.25


@dataclass
class Estimate:
    """A run's predicted peak memory per process, time per step and in all, and cost, with every term."""

    device: str  # "cpu", or the GPU's name
    precision: str
    batch: int
    accumulation: int
    processes: int
    seq_mean: float
    seq_peak: int
    memory: list[Term]
    peak: Term  # MiB per process
    available_mb: float | None  # what the device has (CPU: available now; a GPU: its memory less the context)
    step_terms: list[Term]
    step: Term  # seconds per optimizer step
    steps: int | None
    total: Term | None  # seconds for the whole run (None when the number of steps is unknown)
    cost: float | None  # in the currency of `price_per_hour`
    efficiency: float
    mfu_flops: float  # model FLOPs per step
    model: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    total_parts: list[Term] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        """Whether the predicted peak is within the device's memory (None: not known)."""
        return None if self.available_mb is None else self.peak.value <= self.available_mb

    @property
    def biggest(self) -> Term:
        return max(self.memory, key=lambda t: t.value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "precision": self.precision,
            "batch": self.batch,
            "gradient_accumulation": self.accumulation,
            "processes": self.processes,
            "seq_mean": self.seq_mean,
            "seq_peak": self.seq_peak,
            "peak_mem_mb": self.peak.to_dict(),
            "memory": [t.to_dict() for t in self.memory],
            "available_mb": self.available_mb,
            "fits": self.fits,
            "step_time_s": self.step.to_dict(),
            "step": [t.to_dict() for t in self.step_terms],
            "steps": self.steps,
            "total_time_s": None if self.total is None else self.total.to_dict(),
            "cost": self.cost,
            "efficiency": self.efficiency,
            "model": self.model,
            "notes": list(self.notes),
        }

    def term(self, name: str) -> Term | None:
        return next((t for t in [*self.memory, *self.step_terms] if t.name == name), None)

    def learned(
        self, peak_mb: float | None, step_s: float | None, total_s: float | None = None, eval_s: float | None = None
    ) -> dict[str, float]:
        """What a run's measurements say about the calibrated quantities: on CPU the runtime's memory (the peak less
        the model's terms), on CUDA the activations' scale; the efficiency its steady steps reached; how long its
        evaluation took against the estimate (`eval_s`: one evaluation, measured); the startup (the whole run's time
        less its steps and evaluations)."""
        out: dict[str, float] = {}
        runtime, acts, compute = self.term("runtime"), self.term("activations"), self.term("compute")
        if peak_mb and runtime is not None:
            out["runtime_mb"] = peak_mb - (self.peak.value - runtime.value)
        elif peak_mb and acts is not None and acts.value > 0:
            scale = float(self.model.get("act_scale") or 1.0)
            out["act_scale"] = scale * (peak_mb - (self.peak.value - acts.value)) / acts.value
        if step_s and compute is not None and compute.value >= LEARN_COMPUTE_SHARE * self.step.value:
            left = step_s - (self.step.value - compute.value)
            efficiency = self.efficiency * compute.value / left if left > 0 else None
            if efficiency is not None and efficiency <= 1.0:  # above the measured peak: the other terms were off
                out["efficiency"] = efficiency
        evaluation = next((t.value for t in self.total_parts if t.name == "evaluation"), None)
        rows = self.model.get("eval_rows")
        if eval_s and rows:
            # an evaluation is a forward over its rows, batched apart from training, its time mostly not FLOPs
            # on a small model (tokenized batches, the metric): learned per row, apart from the step's efficiency
            out["eval_row_s"] = eval_s / rows
            evaluation = 2 * eval_s
        if total_s and step_s and self.steps and self.total is not None:
            out["startup_s"] = total_s - self.steps * step_s - (evaluation or 0.0)
        return out

    def compared(self, peak_mb: float | None, step_s: float | None, total_s: float | None = None) -> dict[str, Any]:
        """Predicted against measured, for result.json and the benchmark: each with its relative error."""

        def pair(predicted: Term | None, measured: float | None) -> dict[str, Any]:
            p = None if predicted is None else predicted.value
            error = None if not p or not measured else (p - measured) / measured
            within = None if predicted is None or not measured else predicted.low <= measured <= predicted.high
            return {"predicted": p, "measured": measured, "error": error, "within_range": within}

        return {
            "peak_mem_mb": pair(self.peak, peak_mb),
            "step_time_s": pair(self.step, step_s),
            "total_time_s": pair(self.total, total_s),
            "calibration_key": self.model.get("calibration_key"),
        }

    def table(self, width: int = 80) -> str:
        """The estimate as a plain table (what `ortlab estimate` prints), at most `width` columns."""
        rows = [f"{'memory per process':<24}{'MiB':>10}{'range':>18}  basis"]
        for t in [*self.memory, self.peak]:
            rows.append(_row(t, f"{t.value:,.0f}", f"{t.low:,.0f}-{t.high:,.0f}", width))
        if self.available_mb is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            rows.append(f"{'available':<24}{self.available_mb:>10,.0f}{'':>18}  {verdict}"[:width])
        rows.append("")
        rows.append(f"{'time':<24}{'seconds':>10}{'range':>18}  basis")
        for t in [*self.step_terms, self.step]:
            rows.append(_row(t, _seconds(t.value), f"{_seconds(t.low)}-{_seconds(t.high)}", width))
        if self.total is not None:
            rows.append(
                _row(
                    self.total,
                    _duration(self.total.value),
                    f"{_duration(self.total.low)}-{_duration(self.total.high)}",
                    width,
                )
            )
        if self.cost is not None:
            rows.append(f"{'cost':<24}{self.cost:>10,.2f}")
        head = (
            f"{self.model.get('name', '?')} on {self.device}, {self.precision}, batch {self.batch}"
            f" x {self.accumulation} accumulation x {self.processes} process(es), {self.seq_mean:.0f} tokens/row "
            f"(peak {self.seq_peak})"
        )
        lines = _wrap(head, width) + [""] + [r[:width] for r in rows]
        for note in self.notes:
            lines += _wrap(f"note: {note}", width)
        return "\n".join(lines)


def _row(t: Term, value: str, span: str, width: int) -> str:
    return f"{t.name:<24}{value:>10}{span:>18}  {t.basis}"[:width]


def _seconds(value: float) -> str:
    return f"{value:,.2f}" if value >= 0.1 else f"{value:.2g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def local_gpu_name() -> str | None:
    """The first NVIDIA GPU's name from the driver's /proc files (no torch, no nvidia-smi), None without one."""
    root = Path("/proc/driver/nvidia/gpus")
    try:
        for info in sorted(root.glob("*/information")):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def available_cpu_mb() -> float | None:
    """MemAvailable from /proc/meminfo: what the kernel can give a new process without swapping."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _precision(asked: str, device: str, card: Gpu | None, auto_bf16: float | None = None) -> str:
    """The precision the run will train in. 'auto' on a CPU is the precision race's answer for the model, known
    only once a run of it here measured (`auto_bf16` from the calibration); until then fp32, the race's usual
    answer where bf16 units are missing or slow."""
    if asked != "auto":
        return asked
    if device == "cpu":
        return "bf16" if auto_bf16 is not None and auto_bf16 >= 0.5 else "fp32"
    return "fp16" if card is not None and card.bf16_tflops is None else "bf16"


def as_spec(spec: Any) -> Any:
    """A RunSpec from a RunSpec, a dict, a YAML/JSON path, or None (the embedded default)."""
    from ortlab.spec import RunSpec

    if spec is None:
        return RunSpec()
    if isinstance(spec, (str, Path)):
        return RunSpec.load(spec)
    if isinstance(spec, dict):
        return RunSpec.parse(spec)
    return spec


def estimate(
    spec: Any = None,
    device: str | None = None,
    price_per_hour: float | None = None,
    calibrated: bool | dict[str, dict[str, list[float]]] = True,
    allocator: str | None = None,
) -> Estimate:
    """Estimate `spec` (a RunSpec, a dict or a YAML/JSON path; default: the embedded default run) on `device`:
    None for this machine (its GPU when the driver shows one, else the CPU), "cpu", or a GPU of the table in
    `ortlab.estimator.gpus` ("T4", "A100 80GB", "H100 SXM", ...). `price_per_hour`: the machine's price, for the cost.
    `calibrated=False`: the defaults only, without what runs here measured (to compare the two); a dict: those
    calibration entries instead of this machine's file (the benchmark's leave-one-out). `allocator` ("tcmalloc",
    "glibc"): a CPU process's malloc, which moves its peak RSS; None: the one a run ortlab launches gets here."""
    spec = as_spec(spec)
    name = device if device is not None else (local_gpu_name() or "cpu")
    try:
        card = None if name == "cpu" else gpu(name)
    except ValueError as e:
        raise EstimateError(str(e)) from None
    kind = "cpu" if card is None else "cuda"
    try:
        m = read_model(spec.model.name)
    except (ModelFactsError, OSError, ValueError) as e:
        raise EstimateError(f"cannot estimate {spec.model.name!r}: {e}") from None
    entries = calibrated if isinstance(calibrated, dict) else calibration.load() if calibrated else {}
    auto_bf16 = calibration.value(entries, calibration.auto_key(spec.model.name), "auto_bf16")
    precision = _precision(spec.accel.precision, kind, card, auto_bf16 if kind == "cpu" else None)
    hyper = spec.hyper
    max_length = min(hyper.max_length, m.positions) if m.positions else hyper.max_length
    lengths = sample_lengths(spec, model_folder(spec.model.name), hyper.batch_size, max_length)
    notes = [f"lengths: {lengths.basis}"]
    if spec.accel.precision == "auto" and kind == "cpu":
        notes.append(
            f"precision 'auto': {precision}, "
            + ("as runs of this model here measured" if auto_bf16 is not None else "until a run here measures")
        )
    ckey = calibration.key("cpu" if card is None else card.name, m.family, precision)

    lora = spec.adapter.kind == "lora"
    task = get_task(spec.task)
    classes = 2 if task.labels == "row" else 0
    trainable = m.lora_trainable(spec.adapter.target_modules, spec.adapter.rank, classes) if lora else m.params
    fused = spec.accel.fused_adam in (True, "auto")  # 'auto' resolves to fused where torch has it (2.4+: CPU too)
    setup = Setup(
        device=kind,
        precision=precision,
        batch=hyper.batch_size,
        seq=lengths.peak,
        trainable=trainable,
        processes=spec.target.processes,
        zero_stage=spec.accel.zero_stage,
        optimizer=optimizer_variant(kind, fused),
        checkpointing=hyper.gradient_checkpointing,
        eager_attention=spec.accel.ort is True,
        lm_head=task.lm_head,
        classes=classes,
        allocator=allocator or ("tcmalloc" if kind == "cpu" and tcmalloc.wanted(spec.accel.tcmalloc) else "glibc"),
    )
    if kind == "cpu" and allocator is None:
        notes.append(
            f"malloc: {setup.allocator}, as a launched run has it here"
            + (" (a run in the kernel's own process has glibc's)" if setup.allocator == "tcmalloc" else "")
        )
    mem = memory_terms(
        m, setup, calibration.value(entries, ckey, "runtime_mb"), calibration.value(entries, ckey, "act_scale")
    )
    peak = total("peak", mem)
    if card is None:
        available = available_cpu_mb() if device is None or device == "cpu" else None
        if spec.target.processes > 1 and available is not None:
            available /= spec.target.processes  # every process of a run on this machine shares its memory
            notes.append(f"{spec.target.processes} processes share this machine's memory: the limit is per process")
    else:
        available = card.memory_mb - CUDA_CONTEXT_MB
        notes.append(f"{card.name}: {card.memory_gb:g} GB, peaks from the {card.source}")
        if precision == "bf16" and card.bf16_tflops is None:
            notes.append(f"the {card.name} has no bf16 tensor cores: use fp16 (accel.precision)")

    # time
    if card is None:
        peak_flops, peak_basis, peak_note = cpu_peak(precision)
        notes.append(f"peak: {peak_note}")
        if spec.target.processes > 1:  # the processes of a run here share this CPU's cores, and so its peak
            peak_flops /= spec.target.processes
            notes.append(f"{spec.target.processes} processes share the CPU's peak: each has 1/{spec.target.processes}")
    else:
        peak_flops, peak_basis = card.peak_flops(precision), FORMULA
    measured_eff = calibration.value(entries, ckey, "efficiency")
    if measured_eff is not None:
        eff, eff_basis = measured_eff, MEASURED
    elif card is None:
        eff, eff_basis = EFFICIENCY.get(("cpu", m.family), 0.25), CALIBRATED
    else:
        eff, eff_basis = GPU_EFFICIENCY, ASSUMED
    if peak_basis == ASSUMED:
        eff_basis = ASSUMED
    shape = ModelShape(
        matmul_params=m.matmul_params(task.lm_head),
        trainable_matmul_params=min(trainable, m.matmul_params(task.lm_head)),
        layers=m.layers,
        hidden=m.hidden,
        embedding_params=m.embedding_params,
    )
    accumulation = hyper.gradient_accumulation_steps
    sterms, model_flops = step_terms(
        shape,
        lengths.mean_padded,
        accumulation,
        hyper.batch_size,
        trainable,
        hyper.gradient_checkpointing,
        peak_flops,
        eff,
        eff_basis,
        kind,
        spec.target.processes,
        setup.optimizer,
        spec.accel.zero_stage,
    )
    step = total("step", sterms)
    steps = _steps(spec, lengths)
    run_total, parts = None, []
    if steps is not None:
        eval_rows = spec.data.max_eval_samples or max(1, int((lengths.rows or 0) * spec.data.eval_fraction))
        evals = 2 * eval_seconds(shape, lengths.mean_padded, eval_rows, peak_flops, eff) / spec.target.processes
        eval_row_s = calibration.value(entries, ckey, "eval_row_s")  # what evaluations here took, per row
        if eval_row_s is not None:
            evals = 2 * eval_rows * eval_row_s / spec.target.processes
        start = startup_term(kind, calibration.value(entries, ckey, "startup_s"))
        parts = [
            Term("steps", steps * step.value, steps * step.low, steps * step.high, step.basis, f"{steps} steps"),
            term("evaluation", evals, 0.5, eff_basis, f"2 x {eval_rows} rows"),
            start,
        ]
        run_total = total("whole run", parts)
    cost = None if price_per_hour is None or run_total is None else price_per_hour * run_total.value / 3600
    return Estimate(
        device="cpu" if card is None else card.name,
        precision=precision,
        batch=hyper.batch_size,
        accumulation=accumulation,
        processes=spec.target.processes,
        seq_mean=lengths.mean_padded,
        seq_peak=lengths.peak,
        memory=mem,
        peak=peak,
        available_mb=available,
        step_terms=sterms,
        step=step,
        steps=steps,
        total=run_total,
        cost=cost,
        efficiency=eff,
        mfu_flops=model_flops,
        model={
            **m.to_dict(),
            "trainable": trainable,
            "calibration_key": ckey,
            "allocator": setup.allocator,
            "act_scale": calibration.value(entries, ckey, "act_scale"),
            "eval_rows": eval_rows if steps is not None else None,
        },
        notes=notes,
        total_parts=parts,
    )


def _steps(spec: Any, lengths: Lengths) -> int | None:
    if spec.hyper.max_steps:
        return spec.hyper.max_steps
    if lengths.rows is None:
        return None
    rows = lengths.rows
    if spec.data.eval_split is None:
        rows = int(rows * (1 - spec.data.eval_fraction))
    if spec.data.max_train_samples:
        rows = min(rows, spec.data.max_train_samples)
    per_step = spec.hyper.batch_size * spec.hyper.gradient_accumulation_steps * spec.target.processes
    return max(1, math.ceil(spec.hyper.epochs * rows / per_step))
