"""Text and HTML summaries of runs: the legend labels, and what is shown where widgets cannot render."""

from __future__ import annotations

import html
from typing import Any

from ortlab.chat import latest
from ortlab.runfolder.compare import compare


def _names(applied: list[str], requested: list[str]) -> str:
    return "+".join(applied or [f"{r}?" for r in requested]) or "no acceleration"


def run_label_text(run: Any, run_id: str, accelerations: dict[str, Any] | None = None) -> str:
    """`run-id [ort+fused_adam]`, unescaped: the accelerations that really applied (requested ones, marked `?`,
    until known)."""
    if accelerations is None and run is not None:
        from ortlab.runfolder.stream import summary_of

        summary = summary_of(run.dir.path)
        return f"{run_id} [{_names(summary.applied, summary.requested)}]"
    accelerations = accelerations or {}
    applied = [k for k, v in accelerations.items() if v.get("applied")]
    requested = [k for k, v in accelerations.items() if v.get("requested")]
    return f"{run_id} [{_names(applied, requested) if accelerations else 'no acceleration'}]"


def run_label(run: Any, run_id: str, accelerations: dict[str, Any] | None = None) -> str:
    """`run_label_text`, escaped: plotly draws legend text as (a subset of) HTML, and run ids come from users."""
    return html.escape(run_label_text(run, run_id, accelerations))


def _table_row(r: Any) -> dict[str, str]:
    sps = r.summary.get("steady_samples_per_s")
    ratio = r.ratios.get("samples_per_s")
    metric = next(iter(r.eval.items()), None)
    missing = [a for a in r.requested if a not in r.applied]
    return {
        "run": r.run_id,
        # A damaged folder says why where its state shows (escaped by table_html like every cell).
        "state": f"{r.state}: {r.damaged}" if getattr(r, "damaged", None) else r.state,
        "applied": ", ".join(r.applied) or "none",
        "not applied": ", ".join(missing),
        "step": str(r.summary.get("steps", 0)),
        "samples/s": f"{sps:.2f}" if sps else "-",
        "vs baseline": f"{ratio:.3f}" if ratio else "-",
        "peak MB": f"{r.summary['peak_mem_mb']:.0f}" if r.summary.get("peak_mem_mb") else "-",
        "final loss": f"{r.summary['final_loss']:.4f}" if r.summary.get("final_loss") is not None else "-",
        "eval": f"{metric[0][5:]} {metric[1]:.4f}" if metric else "-",
    }


def rows(runs: list[Any], baseline: str | None = None, summaries: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """One table row per run (plain strings; `table_html` escapes them). `summaries`: run id -> a `RunSummary` the
    caller keeps current (the live charts' own), so a refresh does not re-read the runs' metrics."""

    return [_table_row(r) for r in compare([run.dir for run in runs], baseline=baseline, summaries=summaries)]


def table_html(data: list[dict[str, str]]) -> str:
    if not data:
        return "<div><i>no runs yet</i></div>"
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(k)}</th>" for k in data[0])
    body = "".join(
        "<tr>"
        + "".join(f"<td style='text-align:left;padding:2px 8px'>{html.escape(str(v))}</td>" for v in row.values())
        + "</tr>"
        for row in data
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def static_summary(
    runs: list[Any], title: str = "ortlab runs", summaries: dict[str, Any] | None = None
) -> tuple[str, str]:
    """(html, text) views of `runs` for front ends without widgets: a state line, the loss and throughput curves
    as inline SVG (`ortlab.ui.svg`) and the comparison table, read from the run folders now (the table from
    `summaries` where the caller keeps them current)."""
    from ortlab.ui.svg import runs_chart_html

    compared = compare([run.dir for run in runs], summaries=summaries) if runs else []
    data = [_table_row(r) for r in compared]
    text_lines = [title + (":" if data else ": no runs yet")]
    for row in data:
        text_lines.append("  " + ", ".join(f"{k} {v}" for k, v in row.items() if v))
    labels = {r.run_id: f"{r.run_id} [{_names(r.applied, r.requested)}]" for r in compared}
    charts = runs_chart_html(runs, labels) if runs else ""
    head = f"<b>{html.escape(title)}</b> <small>(static view: the live charts need a running kernel)</small>"
    return f"<div class='ortlab-static'>{head}{charts}{table_html(data)}</div>", "\n".join(text_lines)


def generations_html(records: list[dict[str, Any]], run_id: str = "") -> str:
    """The latest generations of a run (prompt, answer, reference) as a table. Everything is escaped: prompts come
    from the data and answers from the model, both hostile."""

    shown = latest(records)
    if not shown:
        return ""
    first = shown[0]
    where = f"{first.get('phase', '')} step {first.get('step', '?')}"
    title = f"generations of {run_id} ({where})" if run_id else f"generations ({where})"
    cell = "style='text-align:left;vertical-align:top;padding:2px 8px;white-space:pre-wrap;max-width:420px'"
    body = ""
    for r in shown:
        mark = "" if "match" not in r else (" ✓" if r["match"] else " ✗")
        body += (
            f"<tr><td {cell}>{html.escape(str(r.get('prompt', ''))[:400])}</td>"
            f"<td {cell}><b>{html.escape(str(r.get('output', ''))[:400])}</b>{mark}</td>"
            f"<td {cell}>{html.escape(str(r.get('reference', '') or ''))[:400]}</td></tr>"
        )
    head = "".join(f"<th {cell}>{h}</th>" for h in ("prompt", "model says", "expected"))
    return (
        f"<div class='ortlab-generations'><b>{html.escape(title)}</b>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
