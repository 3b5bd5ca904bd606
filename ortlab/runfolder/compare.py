"""Comparing runs: one row per run, ratios against a baseline run. Reads only run folders (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortlab.runfolder.stream import EVAL_KEYS, RunSummary, summary_of


def summarize(records: Any, warmup_steps: int = 2) -> dict[str, Any]:
    """Steady-state throughput from a metrics stream. Each training segment (a start, or a resume) has its
    own warm-up: its first `warmup_steps` steps are counted apart. (The fold is `RunSummary`'s, record by record.)"""
    return RunSummary(warmup_steps).fold_all(records).throughput()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class Row:
    run_id: str
    state: str
    requested: list[str]
    applied: list[str]
    summary: dict[str, Any]
    eval: dict[str, float]
    ratios: dict[str, float | None] = field(default_factory=dict)
    auto: str | None = None  # how the 'auto' accelerations were decided: "measured", "default", or None (none)
    where: str = "local"  # where the run runs: "local", or "cluster ADDRESS" (see `where_for`)
    damaged: str | None = None  # why the run folder cannot be trusted (state "damaged"), else None
    estimate: dict[str, float] = field(default_factory=dict)  # how far the estimate was off: relative errors


def where_for(status: dict[str, Any], summary: RunSummary | None = None) -> str:
    """Where a run runs, from its status (a remote launcher records its cluster there), with its processes and
    restarts from its stream: "local", "local, 2 processes", "cluster ADDRESS, 2 workers, 1 restart"."""
    launcher = status.get("launcher")
    on_cluster = isinstance(launcher, dict) and isinstance(launcher.get("cluster"), str)
    where = f"cluster {launcher['cluster']}" if on_cluster else "local"
    if summary is not None and summary.world_size > 1:
        where += f", {summary.world_size} {'workers' if on_cluster else 'processes'}"
    if summary is not None and summary.restarts:
        where += f", {summary.restarts} restart{'s' if summary.restarts > 1 else ''}"
    return where


ESTIMATED = {"peak_mem_mb": "mem", "step_time_s": "step"}  # result.json's "estimate" entries a row shows


def estimate_errors(result: Any) -> dict[str, float]:
    """How far the run's estimate was off (result.json's "estimate": predicted against measured, written by the run
    from `ortlab.estimate`): the relative error of each of ESTIMATED, numbers only (a run folder is not trusted)."""
    est = result.get("estimate") if isinstance(result, dict) else None
    out: dict[str, float] = {}
    for key in ESTIMATED:
        pair = est.get(key) if isinstance(est, dict) else None
        error = pair.get("error") if isinstance(pair, dict) else None
        if _number(error) and abs(error) < 1000:
            out[key] = float(error)
    return out


def row_for(run: Any, summary: RunSummary | None = None) -> Row:
    """A comparison row from a run folder (finished or not: the metrics stream is enough). `summary`: the run's
    summary where the caller keeps one current (the workbench); else the stream is folded now, in bounded pieces."""
    if summary is None:
        summary = summary_of(run.path)
    result = run.result() or {}
    after = result.get("eval_after") if isinstance(result, dict) else None
    scores = {k: after[k] for k in EVAL_KEYS if _number(after.get(k))} if isinstance(after, dict) and after else None
    status = run.status()  # with the liveness check: a forged pid shows as damaged, with why
    return Row(
        run_id=run.id,
        state=status.get("state", "unknown"),
        requested=summary.requested,
        applied=summary.applied,
        summary=summary.throughput(),
        eval=scores if scores is not None else dict(summary.scores),
        auto=summary.auto,
        where=where_for(status, summary),
        damaged=status.get("damaged"),
        estimate=estimate_errors(result),
    )


def compare(runs: list[Any], baseline: str | None = None, summaries: dict[str, RunSummary] | None = None) -> list[Row]:
    """Rows for `runs`, with throughput, warm-up, memory and eval ratios against `baseline` (default: first).
    `summaries`: run id -> a summary the caller keeps current (the others are read now)."""
    rows = [row_for(r, (summaries or {}).get(r.id)) for r in runs]
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
            "mfu": ratio(r.summary.get("steady_mfu"), base.summary.get("steady_mfu")),
        }
    return rows


# MFU over 100 % cannot be true: the model's FLOPs cannot run faster than the machine's dense matmul peak. It means
# the cached peak (`ortlab.peak`) was measured while other work ran and is too low (a later measurement never lowers
# it, but only a quiet one raises it), so every face that shows MFU says so beside the number, never a bare "220%".
OVER_PEAK = "over the measured peak: measure it again on a quiet machine with `ortlab doctor --refresh`"


def over_peak(mfu: Any) -> bool:
    """Whether an MFU (a fraction of the measured peak) is impossible, so the peak it was taken against is too low."""
    return _number(mfu) and mfu > 1


def mfu_text(mfu: float, digits: int = 1) -> str:
    """MFU in percent; over 100 % with what it means and the remedy (`OVER_PEAK`) beside it."""
    text = f"{100 * mfu:.{digits}f}%"
    return f"{text} ({OVER_PEAK})" if over_peak(mfu) else text


def _mfu_cell(r: Row) -> str:
    """MFU in percent (against the measured peak of the machine that trained) where the run has it, else '-'; over
    100 % flagged (a table cell holds the short form; the remedy is printed under the table)."""
    mfu = r.summary.get("steady_mfu")
    if not _number(mfu):
        return "-"
    return f"{100 * mfu:.1f}% (over the measured peak)" if over_peak(mfu) else f"{100 * mfu:.1f}%"


def _print_over_peak(console: Any, rows: list[Row]) -> None:
    """Under the table: the runs whose MFU is over 100 %, what it means and how to fix it."""
    from rich.markup import escape

    over = [r.run_id for r in rows if over_peak(r.summary.get("steady_mfu"))]
    if over:
        console.print(f"[yellow]MFU of {escape(', '.join(over))} is {escape(OVER_PEAK)}[/]", soft_wrap=True)


def _num(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def _estimate_cell(r: Row) -> str:
    """How far the estimate before Launch was off, e.g. "mem +5% step -31%" (predicted against measured)."""
    return " ".join(f"{ESTIMATED[k]} {e:+.0%}" for k, e in r.estimate.items()) or "-"


def _eval_cell(r: Row) -> str:
    metric = next(iter(r.eval.items()), None)
    return f"{metric[0][5:]} {metric[1]:.4f}" if metric else "-"


def _applied_cell(r: Row) -> str:
    """Rich markup: the names come from the run folder's metrics, so they are escaped."""
    from rich.markup import escape

    missing = [a for a in r.requested if a not in r.applied]
    applied = escape(", ".join(r.applied) or "none")
    if r.auto:
        applied += f" (auto: {escape(r.auto)})"
    return applied + (f" [red](NOT: {escape(', '.join(missing))})[/]" if missing else "")


def _fits(console: Any, table: Any) -> bool:
    """Would `table` fit the terminal without wrapping a cell? (Measured unconstrained: rich clamps to the width.)"""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width


# Terminal layouts. A table only shows when it fits the terminal whole; otherwise a narrower layout of the same
# facts is printed, never cells cut to "sequence-class…" (every cell folds rather than ends in an ellipsis).


def render(rows: list[Row], console: Any = None) -> None:
    """The comparison in the terminal: one wide table if the terminal is wide enough, else runs side by side
    as lettered columns (A, B, ...) with the metrics as rows, which fits 80 columns for a handful of runs."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Everything from a run folder (ids, states, acceleration names) is escaped: `[/x]` is rich markup.
    console = console or Console()
    base = rows[0].run_id if rows else "-"
    for r in rows:
        if r.ratios and all(v == 1.0 for v in r.ratios.values() if v is not None):
            base = r.run_id
            break
    table = Table(title=f"baseline: {escape(base)} (x: run / baseline)", box=box.SIMPLE_HEAD)
    for col in ("run", "state", "applied (requested)", "samples/s", "x", "warm-up s", "x", "peak MB", "x"):
        table.add_column(col, overflow="fold")
    table.add_column("final loss", overflow="fold")
    table.add_column("eval", overflow="fold")
    with_mfu = any(_number(r.summary.get("steady_mfu")) for r in rows)  # runs from before the measured peak have none
    if with_mfu:
        table.add_column("MFU", overflow="fold")
    for r in rows:
        table.add_row(
            escape(r.run_id),
            escape(r.state),
            _applied_cell(r),
            _num(r.summary.get("steady_samples_per_s")),
            _num(r.ratios.get("samples_per_s"), ".3f"),
            _num(r.summary.get("warmup_time_s"), ".1f"),
            _num(r.ratios.get("warmup_time"), ".2f"),
            _num(r.summary.get("peak_mem_mb"), ".0f"),
            _num(r.ratios.get("peak_mem"), ".3f"),
            _num(r.summary.get("final_loss"), ".4f"),
            _eval_cell(r),
            *([_mfu_cell(r)] if with_mfu else []),
        )
    if _fits(console, table):
        console.print(table)
        _print_workers(console, rows)
        _print_damaged(console, rows)
        _print_over_peak(console, rows)
        return
    letters = [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(len(rows))]
    for letter, r in zip(letters, rows, strict=True):
        console.print(
            f"[bold]{letter}[/] {escape(r.run_id)}" + ("  (baseline)" if r.run_id == base else ""), soft_wrap=True
        )

    def with_ratio(value: str, ratio: Any) -> str:
        return value if value == "-" or not isinstance(ratio, (int, float)) else f"{value} ({ratio:.2f}x)"

    narrow = Table(box=box.SIMPLE_HEAD, caption="(x: run / baseline)")
    narrow.add_column("", style="bold", overflow="fold")
    for letter in letters:
        narrow.add_column(letter, overflow="fold")
    facts = {
        "state": [escape(r.state) for r in rows],
        "applied": [_applied_cell(r) for r in rows],
        "samples/s": [
            with_ratio(_num(r.summary.get("steady_samples_per_s")), r.ratios.get("samples_per_s")) for r in rows
        ],
        "warm-up s": [
            with_ratio(_num(r.summary.get("warmup_time_s"), ".1f"), r.ratios.get("warmup_time")) for r in rows
        ],
        "peak MB": [with_ratio(_num(r.summary.get("peak_mem_mb"), ".0f"), r.ratios.get("peak_mem")) for r in rows],
        "final loss": [with_ratio(_num(r.summary.get("final_loss"), ".4f"), r.ratios.get("final_loss")) for r in rows],
        "eval": [_eval_cell(r) for r in rows],
    }
    if with_mfu:
        facts["MFU"] = [_mfu_cell(r) for r in rows]
    for name, cells in facts.items():
        narrow.add_row(name, *cells)
    console.print(narrow)
    _print_workers(console, rows)
    _print_damaged(console, rows)
    _print_over_peak(console, rows)


def worker_throughput(summary: dict[str, Any]) -> list[float] | None:
    """Each rank's steady samples/s (its share of a step's samples over its own mean step time), for a run of
    several processes; None for one process. A straggler is the rank whose number is lowest."""
    times, rate, step = (summary.get(k) for k in ("worker_step_time_s", "steady_samples_per_s", "steady_step_time_s"))
    if not isinstance(times, list) or not times or not _number(rate) or not _number(step):
        return None
    per_rank = rate * step / len(times)  # samples one rank trains per step
    return [per_rank / t if _number(t) else 0.0 for t in times]


def _print_workers(console: Any, rows: list[Row]) -> None:
    """Per-worker throughput under the table, one line per run of several processes."""
    from rich.markup import escape

    for r in rows:
        each = worker_throughput(r.summary)
        if each:
            ranks = ", ".join(f"rank {i} {v:.1f}" for i, v in enumerate(each))
            spread = min(each) / max(each) if max(each) > 0 else 0.0
            console.print(
                f"{escape(r.run_id)}: samples/s per worker: {ranks} (slowest / fastest {spread:.2f})", soft_wrap=True
            )


def _print_damaged(console: Any, rows: list[Row]) -> None:
    """Why each damaged run folder is not trusted, one line each under the table."""
    from rich.markup import escape

    for r in rows:
        if r.damaged:
            console.print(f"[red]damaged[/] {escape(r.run_id)}: {escape(r.damaged)}", soft_wrap=True)


def _mix_cell(r: Row) -> str:
    """What applied, and whether 'auto' was measured for this run (the table is in its tune.json); escaped."""
    from rich.markup import escape

    return escape(", ".join(r.applied) or "-") + (" (measured)" if r.auto == "measured" else "")


def render_runs(rows: list[Row], title: str, console: Any = None) -> None:
    """`ortlab runs`: a table when the terminal is wide enough, else two lines per run (nothing cut)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    title = escape(title)  # the runs folder's path: a folder name can hold `[`
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in ("run", "state", "where", "step", "applied", "samples/s", "eval", "vs estimate"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            escape(r.run_id),
            escape(r.state),
            escape(r.where),
            str(r.summary["steps"]),
            _mix_cell(r),
            _num(r.summary.get("steady_samples_per_s")),
            _eval_cell(r),
            _estimate_cell(r),
        )
    if not rows:
        console.print(f"{title}: none yet", soft_wrap=True)
        return
    if _fits(console, table):
        console.print(table)
        _print_damaged(console, rows)
        return
    console.print(f"[bold]{title}[/]", soft_wrap=True)
    for r in rows:
        console.print(
            f"[bold]{escape(r.run_id)}[/]  {escape(r.state)} ({escape(r.where)}), step {r.summary['steps']}",
            soft_wrap=True,
        )
        console.print(
            f"    applied: {_mix_cell(r)};  "
            f"{_num(r.summary.get('steady_samples_per_s'))} samples/s;  eval: {_eval_cell(r)};  "
            f"estimate off by: {_estimate_cell(r)}"
        )
    _print_damaged(console, rows)
