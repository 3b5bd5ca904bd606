"""Comparing runs: one row per run, ratios against a baseline run. Reads only run folders (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EVAL_KEYS = ("eval_accuracy", "eval_f1", "eval_perplexity", "eval_loss")


def summarize(records: list[dict[str, Any]], warmup_steps: int = 2) -> dict[str, Any]:
    """Steady-state throughput from a metrics stream. Each training segment (a start, or a resume) has its
    own warm-up: its first `warmup_steps` steps are counted apart."""
    segments: list[list[dict]] = []
    for r in records:
        if r.get("event") == "train_begin" or not segments:
            segments.append([])
        if r.get("event") == "step":
            segments[-1].append(r)
    warm = [s for seg in segments for s in seg[:warmup_steps]]
    steady = [s for seg in segments for s in seg[warmup_steps:]]
    steps = [s for seg in segments for s in seg]
    out: dict[str, Any] = {
        "steps": max((s["step"] for s in steps), default=0),
        "warmup_steps": len(warm),
        "warmup_time_s": sum(s["step_time_s"] for s in warm),
        "final_loss": steps[-1]["loss"] if steps else None,
        "peak_mem_mb": max((s["peak_mem_mb"] for s in steps), default=None),
        "mem_kind": steps[-1].get("mem_kind") if steps else None,
    }
    t = sum(s["step_time_s"] for s in steady)
    if steady and t > 0:
        out["steady_samples_per_s"] = sum(s["samples"] for s in steady) / t
        out["steady_tokens_per_s"] = sum(s["tokens"] for s in steady) / t
        out["steady_step_time_s"] = t / len(steady)
    return out


@dataclass
class Row:
    run_id: str
    state: str
    requested: list[str]
    applied: list[str]
    summary: dict[str, Any]
    eval: dict[str, float]
    ratios: dict[str, float | None] = field(default_factory=dict)


def row_for(run: Any) -> Row:
    """A comparison row from a run folder (finished or not: the metrics stream is enough)."""
    records = run.metrics()
    accelerations: dict[str, Any] = {}
    for r in records:
        if r.get("event") in ("train_begin", "train_end") and r.get("accelerations"):
            accelerations = r["accelerations"]
    result = run.result() or {}
    evals = [r for r in records if r.get("event") == "eval"]
    last_eval = result.get("eval_after") or (evals[-1] if evals else {})
    return Row(
        run_id=run.id,
        state=run.state,
        requested=[k for k, v in accelerations.items() if v.get("requested")],
        applied=[k for k, v in accelerations.items() if v.get("applied")],
        summary=summarize(records),
        eval={k: last_eval[k] for k in EVAL_KEYS if isinstance(last_eval.get(k), (int, float))},
    )


def compare(runs: list[Any], baseline: str | None = None) -> list[Row]:
    """Rows for `runs`, with throughput, warm-up, memory and eval ratios against `baseline` (default: first)."""
    rows = [row_for(r) for r in runs]
    if not rows:
        return rows
    base = next((r for r in rows if r.run_id == baseline), None) if baseline else rows[0]
    if base is None:
        raise ValueError(f"baseline {baseline!r} is not among the compared runs {[r.run_id for r in rows]}")

    def ratio(a: Any, b: Any) -> float | None:
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    for r in rows:
        r.ratios = {
            "samples_per_s": ratio(r.summary.get("steady_samples_per_s"), base.summary.get("steady_samples_per_s")),
            "warmup_time": ratio(r.summary.get("warmup_time_s"), base.summary.get("warmup_time_s")),
            "peak_mem": ratio(r.summary.get("peak_mem_mb"), base.summary.get("peak_mem_mb")),
            "final_loss": ratio(r.summary.get("final_loss"), base.summary.get("final_loss")),
        }
    return rows


def render(rows: list[Row], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    def num(v: Any, fmt: str = ".2f") -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    table = Table(title=f"baseline: {rows[0].run_id if rows else '-'} (ratios are run / baseline)")
    for col in (
        "run",
        "state",
        "applied (requested)",
        "samples/s",
        "x",
        "warm-up s",
        "x",
        "peak MB",
        "x",
        "final loss",
        "eval",
    ):
        table.add_column(col)
    for r in rows:
        missing = [a for a in r.requested if a not in r.applied]
        applied = ", ".join(r.applied) or "none"
        if missing:
            applied += f" [red](NOT: {', '.join(missing)})[/]"
        metric = next(iter(r.eval.items()), None)
        table.add_row(
            r.run_id,
            r.state,
            applied,
            num(r.summary.get("steady_samples_per_s")),
            num(r.ratios.get("samples_per_s"), ".3f"),
            num(r.summary.get("warmup_time_s"), ".1f"),
            num(r.ratios.get("warmup_time"), ".2f"),
            num(r.summary.get("peak_mem_mb"), ".0f"),
            num(r.ratios.get("peak_mem"), ".3f"),
            num(r.summary.get("final_loss"), ".4f"),
            f"{metric[0][5:]} {metric[1]:.4f}" if metric else "-",
        )
    (console or Console()).print(table)
