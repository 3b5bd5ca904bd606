"""The live chart's widget: plotly.js in the browser, fed only the points that are new.

plotly's FigureWidget syncs a figure's data as widget state: a curve that got one new point travels whole (it has
no extend-traces message), so a refresh costs the kernel, the wire and the browser in proportion to what is drawn.
This widget (anywidget, the base plotly's own FigureWidget is built on, so it renders wherever that one did:
JupyterLab, Notebook 7, classic Notebook, VS Code, Colab) keeps only the figure *without data* as state (layout,
trace styles and names: small, and changed only when a trace is added or relabelled) and sends points as custom
messages: per curve, how many points the browser keeps and which to append (`LiveSeries.take()`), drawn there with
plotly.js's `extendTraces` (`livechart.js`). So a refresh's bytes and work follow the new points, not the run.

plotly.js itself comes from the installed plotly package (`package_data/plotly.min.js`), sent once per page when
the first view asks for it: no CDN (the page works offline), and no 4.8 MB in every widget's state.

The browser reports how long each message took to draw; `interval()` spaces the refreshes so that drawing and the
kernel's own share of a refresh stay under `SHARE` of one core (never faster than the monitor's `throttle_s`).

A custom message from the browser is handled when the kernel is idle (between cells): a view opened while a cell
runs draws once that cell ends. The caller serializes `send_points` and `snapshot` (the monitor's lock).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

log = logging.getLogger(__name__)

SHARE = 0.025  # of one core, for drawing a refresh (browser) and preparing it (kernel)
MAX_INTERVAL_S = 5.0  # a slow browser still sees the run move
SMOOTHING = 0.3  # weight of the newest render time in the running estimate
# Until a view has reported one: a refresh of the four panels drawn and painted took 60-200 ms in chromium on 2
# cores; starting from 0 made the first refreshes of a short run come every 0.5 s, where most of its cost was.
ASSUMED_RENDER_S = 0.05

# One curve's change: (trace index, points the browser keeps, xs to append, ys to append).
Op = tuple[int, int, list[float], list[float]]


def _plotly_js() -> bytes:
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


class LiveChart(anywidget.AnyWidget):
    """A plotly figure whose curves grow by appended points. `figure_layout` (plotly's layout) and `traces` (styles
    and names, no data) are synced state; points travel through `send_points`.

    plotly's layout is `figure_layout`, not `layout`: every DOM widget already has a synced `layout`, ipywidgets'
    `Layout` model (CSS size and placement), and its front end (`DOMWidgetView.setLayout`) creates a view of
    whatever that trait holds. A plain dict there made every view of this chart throw "Cannot read properties of
    undefined (reading 'then')" (`create_view` reads a model's `state_change`) as it was displayed (#42)."""

    _esm = Path(__file__).with_name("livechart.js")
    figure_layout = traitlets.Dict().tag(sync=True)
    traces = traitlets.List().tag(sync=True)

    def __init__(self, snapshot: Callable[[], list[Op]] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._snapshot = snapshot  # every curve as the browser should hold it: what a new view is sent
        self.render_ms: list[float] = []  # as the browser reported them (the last 1,000)
        self.render_s = ASSUMED_RENDER_S  # running estimate of one refresh's drawing time (until a view reports)
        self.kernel_s = 0.0  # ... and of the kernel's part (set by the monitor)
        self.messages_sent = 0
        self.bytes_sent = 0
        self.last_bytes = 0
        self.on_msg(self._on_message)

    def set_figure(self, figure: Any) -> None:
        """Take layout and trace styles from a plotly `Figure` (its data is not sent: points travel as messages)."""
        traces = []
        for trace in figure.data:
            style = trace.to_plotly_json()
            style.pop("x", None)
            style.pop("y", None)
            traces.append(style)
        with self.hold_sync():
            self.traces = json.loads(json.dumps(traces, default=_plain))
            self.figure_layout = json.loads(json.dumps(figure.layout.to_plotly_json(), default=_plain))

    def send_points(self, ops: list[Op], snapshot: bool = False) -> int:
        """Send the curves' changes in one message; returns its size in bytes (JSON, what the comm carries)."""
        content = {"type": "points", "snapshot": snapshot, "ops": ops}
        size = len(json.dumps(content, separators=(",", ":")))
        self.send(content)
        self.messages_sent += 1
        self.bytes_sent += size
        self.last_bytes = size
        return size

    def interval(self, fastest_s: float) -> float:
        """Seconds until the next refresh: a refresh's cost (drawing plus the kernel's part) over `SHARE`, at most
        `MAX_INTERVAL_S`, and never less than `fastest_s` (the monitor's `throttle_s`)."""
        return max(fastest_s, min(MAX_INTERVAL_S, (self.render_s + self.kernel_s) / SHARE))

    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "plotly":
            self.send({"type": "plotly"}, buffers=[_plotly_js()])
        elif kind == "snapshot" and self._snapshot is not None:
            self.send_points(self._snapshot(), snapshot=True)
        elif kind == "rendered":
            ms = content.get("ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 <= ms < 600_000:
                self.render_ms = [*self.render_ms[-999:], float(ms)]
                self.render_s += SMOOTHING * (ms / 1000 - self.render_s)


def _plain(value: Any) -> Any:
    """numpy arrays and scalars in plotly's JSON (subplot domains, say) as plain numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot send {type(value).__name__} to the chart")
