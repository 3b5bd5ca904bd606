"""Text and HTML summaries of runs: the legend labels, and what is shown where widgets cannot render."""

from __future__ import annotations

import html
from typing import Any


def run_label(run: Any, run_id: str, accelerations: dict[str, Any] | None = None) -> str:
    """`run-id [ort+fused_adam]`: the accelerations that really applied (requested ones until known)."""
    if accelerations is None and run is not None:
        from ortlab.runner.compare import row_for

        row = row_for(run.dir)
        names = row.applied or [f"{r}?" for r in row.requested]
    elif accelerations:
        applied = [k for k, v in accelerations.items() if v.get("applied")]
        names = applied or [f"{k}?" for k, v in accelerations.items() if v.get("requested")]
    else:
        names = []
    # Plotly draws legend text as (a subset of) HTML: escape, as every name that comes from a user or a file.
    return html.escape(f"{run_id} [{'+'.join(names) or 'no acceleration'}]")


def rows(runs: list[Any], baseline: str | None = None) -> list[dict[str, str]]:
    from ortlab.runner.compare import compare

    out = []
    for r in compare([run.dir for run in runs], baseline=baseline):
        sps = r.summary.get("steady_samples_per_s")
        ratio = r.ratios.get("samples_per_s")
        metric = next(iter(r.eval.items()), None)
        missing = [a for a in r.requested if a not in r.applied]
        out.append(
            {
                "run": r.run_id,
                "state": r.state,
                "applied": ", ".join(r.applied) or "none",
                "not applied": ", ".join(missing),
                "step": str(r.summary.get("steps", 0)),
                "samples/s": f"{sps:.2f}" if sps else "-",
                "vs baseline": f"{ratio:.3f}" if ratio else "-",
                "peak MB": f"{r.summary['peak_mem_mb']:.0f}" if r.summary.get("peak_mem_mb") else "-",
                "final loss": f"{r.summary['final_loss']:.4f}" if r.summary.get("final_loss") is not None else "-",
                "eval": f"{metric[0][5:]} {metric[1]:.4f}" if metric else "-",
            }
        )
    return out


def table_html(data: list[dict[str, str]]) -> str:
    if not data:
        return "<i>no runs yet</i>"
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(k)}</th>" for k in data[0])
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>"
        for row in data
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def static_summary(runs: list[Any], title: str = "ortlab runs") -> tuple[str, str]:
    """(html, text) summaries of `runs` for front ends without widgets."""
    data = rows(runs) if runs else []
    text_lines = [title + (":" if data else ": no runs yet")]
    for row in data:
        text_lines.append("  " + ", ".join(f"{k} {v}" for k, v in row.items() if v))
    return f"<b>{html.escape(title)}</b> (static view: widgets are not available here)" + table_html(data), "\n".join(
        text_lines
    )
