"""Runs' curves as inline SVG: what a notebook shows where the live plotly chart cannot render.

A saved or executed notebook (papermill, nbconvert's HTML, GitHub's viewer, a kernel that has gone away) has no
widget JavaScript: the live chart (`ortlab.ui.livechart`) renders as nothing, and without a picture a reader cannot
tell whether the run learned. So every run view carries a small static chart beside the widget, in its `text/html`
output.

It is plain SVG written here (no matplotlib or kaleido: heavy, and kaleido wants a browser) and theme-neutral:
text, axes and grid use `currentColor`, so they take the page's text colour in JupyterLab's light and dark themes
alike, and the background is left transparent. Every label is escaped: run ids and names come from users and
folders. Only the loss (train, and eval where logged) and samples/s are drawn: the two numbers a reader of a
finished run looks for; the live chart has the rest.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

from ortlab.runfolder import events
from ortlab.safeio import real_number

# Plotly's default qualitative colours: readable on white and on JupyterLab's dark background. One colour per
# run, in the live chart and here alike, so the legend maps a run to its curves in every panel.
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")
MAX_RUNS = 8  # more overlaid curves than this are unreadable: the most recent ones are drawn
MAX_POINTS = 400  # per curve: a 10,000-step run would otherwise make a 200 kB output
MARKERS_UP_TO = 40  # points per curve up to which each point gets a dot (a short smoke run still reads)


@dataclass
class Series:
    """One curve: its legend label (plain text, escaped when drawn), points, colour and dash."""

    label: str
    color: str
    dashed: bool = False
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)

    def add(self, x: Any, y: Any) -> None:
        """Keep the point if both are finite numbers (a NaN loss or a damaged line is left out, not drawn at 0)."""
        if _finite(x) and _finite(y):
            self.xs.append(float(x))
            self.ys.append(float(y))


def _finite(v: Any) -> bool:
    return real_number(v) is not None


def _ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """About `count` round values (1, 2, 2.5 or 5 times a power of ten apart) between lo and hi."""
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _span(values: list[float], pad: float) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):  # a flat curve (or one point): give it a visible band
        half = abs(hi) * 0.05 or 1.0
        return lo - half, hi + half
    margin = (hi - lo) * pad
    return lo - margin, hi + margin


def _thin(xs: list[float], ys: list[float], limit: int) -> tuple[list[float], list[float]]:
    """Every k-th point so that at most `limit` remain, always keeping the last (the number a reader wants)."""
    if len(xs) <= limit:
        return xs, ys
    k = math.ceil(len(xs) / limit)
    keep = list(range(0, len(xs), k))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def line_chart(title: str, series: list[Series], width: int = 420, height: int = 230, x_label: str = "step") -> str:
    """An SVG line chart of `series` (at least one point among them, else a short note)."""
    e = html.escape
    drawn = [s for s in series if s.xs]
    if not drawn:
        return f"<div><small>{e(title)}: no points logged yet</small></div>"
    left, right, top, bottom = 56, 12, 24, 34
    x_lo, x_hi = _span([x for s in drawn for x in s.xs], 0.0)
    y_lo, y_hi = _span([y for s in drawn for y in s.ys], 0.06)
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + (y_hi - y) / (y_hi - y_lo) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="ortlab-chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title, quote=True)}" '
        'font-family="sans-serif" font-size="11" fill="currentColor" style="overflow:visible">',
        f"<title>{e(title)}</title>",
        f'<text x="{left}" y="14" font-weight="bold" font-size="12">{e(title)}</text>',
    ]
    for t in _ticks(y_lo, y_hi):
        y = py(t)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" '
            'stroke-opacity="0.15"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{t:.4g}</text>'
        )
    for t in _ticks(x_lo, x_hi):
        x = px(t)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" stroke="currentColor" '
            'stroke-opacity="0.5"/>'
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{t:g}</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="currentColor" '
        'stroke-opacity="0.35"/>'
        f'<text x="{width - right}" y="{height - 4}" text-anchor="end" fill-opacity="0.7">{e(x_label)}</text>'
    )
    for s in drawn:
        xs, ys = _thin(s.xs, s.ys, MAX_POINTS)
        points = [(px(x), py(y)) for x, y in zip(xs, ys, strict=True)]
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
        summary = f"{s.label}: {len(s.xs)} points, {s.ys[0]:.4g} at {s.xs[0]:g} to {s.ys[-1]:.4g} at {s.xs[-1]:g}"
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        parts.append(
            f'<path class="ortlab-series" data-label="{e(s.label, quote=True)}" d="{d}" fill="none" '
            f'stroke="{s.color}" stroke-width="1.6"{dash}><title>{e(summary)}</title></path>'
        )
        if len(points) <= MARKERS_UP_TO or s.dashed:
            parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{s.color}"/>' for x, y in points)
    parts.append("</svg>")
    return "".join(parts)


def _legend(entries: list[tuple[str, str]], with_eval: bool) -> str:
    items = "".join(
        f"<span style='margin-right:14px;white-space:nowrap'><span style='color:{color}'>&#9644;</span> "
        f"{html.escape(label)}</span>"
        for label, color in entries
    )
    note = " <small>(dashed: eval loss)</small>" if with_eval else ""
    return f"<div class='ortlab-legend' style='font-size:12px'>{items}{note}</div>"


def runs_chart_html(runs: list[Any], labels: dict[str, str] | None = None) -> str:
    """Loss and samples/s of `runs` (ortlab `Run`s, read from their run folders now), side by side, with a legend
    of one colour per run. `labels` maps a run id to its legend text (default: the id)."""
    shown = runs[-MAX_RUNS:]
    loss: list[Series] = []
    speed: list[Series] = []
    legend = []
    for i, run in enumerate(shown):
        color = PALETTE[i % len(PALETTE)]
        label = (labels or {}).get(run.id, run.id)
        train, evals, sps = (
            Series(f"{label} (train)", color),
            Series(f"{label} (eval)", color, True),
            Series(label, color),
        )
        try:
            for r in run.dir.records():  # in bounded pieces: memory for the points, not for the file
                if r.get("event") == events.STEP:
                    train.add(r.get("step"), r.get("loss"))
                    sps.add(r.get("step"), r.get("samples_per_s"))
                elif r.get("event") == events.EVAL:
                    evals.add(r.get("step"), r.get("eval_loss"))
        except OSError:  # a run folder removed under us: its curve is simply absent
            pass
        loss += [train, evals]
        speed.append(sps)
        legend.append((label, color))
    if not any(s.xs for s in loss + speed):
        return "<div><small>no training steps logged yet</small></div>"
    more = f" <small>(the {len(shown)} most recent of {len(runs)} runs)</small>" if len(runs) > len(shown) else ""
    return (
        "<div class='ortlab-static-charts' style='display:flex;flex-wrap:wrap;gap:12px'>"
        + line_chart("loss (train, eval)", loss)
        + line_chart("samples/s", speed)
        + "</div>"
        + _legend(legend, with_eval=any(s.xs for s in loss if s.dashed))
        + more
    )
