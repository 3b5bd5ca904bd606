"""Live charts of runs: train/eval loss, samples/s, step time, peak memory, MFU, and on a GPU reserved memory
(the last row drawn only once a run brings such numbers), several runs overlaid.

`RunMonitor(run)` follows each run's metrics stream in a background thread and draws it in a `LiveChart`
(`ortlab.ui.livechart`: plotly.js, fed only new points). Points are buffered and sent together, one message per
refresh: a per-point update floods the browser (1,600 messages for 200 steps were seen with plotly's widget). The
refreshes are spaced by what drawing them costs (`LiveChart.interval`: a small share of a core, never faster than
`throttle_s`). Each legend entry says which accelerations really applied to that run.

What a refresh costs does not grow with the run: each curve is drawn with at most `max_points` points
(`ortlab.runfolder.downsample.LiveSeries`: min and max per bucket, redrawn downsampled only when the run's length
has doubled), and a refresh sends each changed curve's new points only (`LiveSeries.take()`), appended in the
browser; a whole curve travels only when it is redrawn (once per doubling) or a view opens. `self.figure` is a
plotly `Figure` holding the layout and the traces' styles and names, without data; the drawn points are
`drawn()`, and the full data stays in the run folder (`series()` gives it back at full resolution).

Where widgets cannot render (papermill, nbconvert, GitHub, a terminal), the monitor's output carries a static view
instead: the curves as SVG and the runs table (`ortlab.ui.summary`), kept up to date by `ortlab.ui.display`.

The figure is drawn for JupyterLab's light and dark themes alike: a transparent background (the page's shows
through, so no white box on a dark page), and mid-grey text and grid lines, readable on either. Plotly cannot
take the theme's CSS variables as colours, so neutral ones are the choice.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from ortlab.runfolder import events, records
from ortlab.runfolder.compare import OVER_PEAK, over_peak
from ortlab.runfolder.downsample import LiveSeries
from ortlab.runfolder.history import History, as_float, read_history
from ortlab.runfolder.stream import RunSummary
from ortlab.ui.display import RefreshedDisplay
from ortlab.ui.livechart import SMOOTHING, LiveChart, Op
from ortlab.ui.summary import run_label, static_summary
from ortlab.ui.svg import PALETTE

# The panels: the step fields the record schema says the charts draw (`ortlab.runfolder.records`), with their titles.
PANELS = records.panels()
# The eval fields drawn too, each on the panel of its name without "eval_" (eval_loss beside the training loss).
EVAL_CURVES = records.drawn(events.EVAL, records.CHARTS)
# The last row's panels: the fields only some runs write (MFU where the model's FLOPs are counted, GPU memory on
# CUDA). Each is laid out only once a run brings a point for it; until then the figure is two rows, without empty
# panels.
GPU_PANELS = tuple(name for name, _ in PANELS if records.record(events.STEP).field(name).when)
ROWS_HEIGHT = {2: 500, 3: 740}
ROWS_SPACING = {2: 0.2, 3: 0.14}  # about the same gap in pixels
TRANSPARENT = "rgba(0,0,0,0)"
NEUTRAL_TEXT = "#808080"  # about 4:1 contrast on white and on JupyterLab's dark background
NEUTRAL_GRID = "rgba(128,128,128,0.25)"
# Points drawn per curve: more than a panel's width in pixels (about 600), so downsampling loses nothing visible,
# and few enough that a refresh's message and the browser's redraw stay small (1,000 points are ~20 kB of JSON).
MAX_POINTS = 1000
# The records that change a run's legend label (what applied).
_RELABEL = (events.TRAIN_BEGIN, events.VERIFIED, events.TRAIN_END, events.ACCELERATION)


def _panel_of(eval_field: str) -> str:
    """The panel an eval field is drawn on: its name without "eval_" (eval_loss: the loss panel)."""
    return eval_field.removeprefix("eval_")


def _figure() -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=3, cols=2, subplot_titles=[title for _, title in PANELS], horizontal_spacing=0.08, vertical_spacing=0.14
    )
    widget = go.Figure(fig)
    widget.update_layout(
        height=740,
        margin={"l": 40, "r": 10, "t": 40, "b": 30},
        legend={"orientation": "h"},
        template="none",  # plotly_white paints white boxes and near-white grid lines: wrong on a dark page
        paper_bgcolor=TRANSPARENT,
        plot_bgcolor=TRANSPARENT,
        font={"color": NEUTRAL_TEXT},
    )
    axis = {"gridcolor": NEUTRAL_GRID, "zerolinecolor": NEUTRAL_GRID, "linecolor": NEUTRAL_GRID, "showline": True}
    widget.update_xaxes(**axis)
    widget.update_yaxes(**axis)
    widget.update_annotations(font={"color": NEUTRAL_TEXT})  # the panel titles
    _arrange(widget, set())
    return widget


def _arrange(widget: Any, with_data: set[str]) -> None:
    """Show every panel but the GPU ones without data (axes and title hidden), in two rows or, with a GPU panel,
    three; the domains come from plotly's own grid of that many rows."""
    from plotly.subplots import make_subplots

    rows = 3 if with_data & set(GPU_PANELS) else 2
    grid = make_subplots(rows=rows, cols=2, horizontal_spacing=0.08, vertical_spacing=ROWS_SPACING[rows]).layout
    widget.layout.height = ROWS_HEIGHT[rows]
    for i, (name, _) in enumerate(PANELS):
        shown = name not in GPU_PANELS or name in with_data
        axis = "" if i == 0 else str(i + 1)
        title = widget.layout.annotations[i]
        widget.layout[f"xaxis{axis}"].visible = shown
        widget.layout[f"yaxis{axis}"].visible = shown
        title.visible = shown
        if i < rows * 2:
            widget.layout[f"yaxis{axis}"].domain = grid[f"yaxis{axis}"].domain
            title.y = grid[f"yaxis{axis}"].domain[1]


def _import_before_threads() -> None:
    """Import pandas in the calling (the kernel's) thread before the monitor's threads start. plotly imports it
    lazily on a figure's first update; done on the flush thread while a notebook cell imports pandas too (through
    `datasets`, say), one of them saw a partially initialised module (AttributeError in the flush thread, seen in
    notebook 07's first version). Where pandas is not installed, plotly does without it."""
    import importlib.util

    if importlib.util.find_spec("pandas") is not None:
        import pandas  # noqa: F401


class RunMonitor(RefreshedDisplay, widgets.VBox):
    """Live charts for one or more runs (`ortlab.Run` objects). Works alone: `RunMonitor(run)`."""

    def __init__(self, *runs: Any, throttle_s: float = 0.5, max_points: int = MAX_POINTS, **kwargs: Any):
        self.figure = _figure()  # layout and trace styles; the points live in the series and the browser
        self.chart = LiveChart(snapshot=self._snapshot)
        self._figure_changed = True  # a trace added or renamed, or the panels rearranged, since the last refresh
        self.status = widgets.HTML()
        super().__init__([self.status, self.chart], **kwargs)
        self.throttle_s = throttle_s
        self.max_points = max_points
        self.updates_sent = 0  # refreshes sent to the front end (what the throttle bounds)
        self.points_received = 0
        self.points_sent = 0  # points sent to the front end, over all refreshes
        self.last_points_sent = 0  # ... in the last refresh (the new points; a curve's whole only when redrawn)
        self._lock = threading.Lock()
        self._series: dict[int, LiveSeries] = {}  # trace index -> its curve (every point, and what is drawn)
        self._changed: set[int] = set()  # traces with points not sent yet
        self._traces: dict[tuple[str, str], int] = {}
        self._with_data: set[str] = set()  # the GPU panels some run brought a point for (see _arrange)
        self.over_peak = False  # some run's MFU went over 100 %: the panel's title says what that means
        self._runs: dict[str, Any] = {}
        # Each run's summary, folded from the records as they are drawn: the workbench's table reads these instead
        # of re-reading every run's metrics file on each refresh.
        self.summaries: dict[str, RunSummary] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.on_change: Any = None  # called after new points were sent and when a followed run ends
        _import_before_threads()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True, name="ortlab-monitor-flush")
        self._flusher.start()
        for run in runs:
            self.add_run(run)

    # --- data in -----------------------------------------------------------------------------------------

    def add_run(self, run: Any, follow: bool = True) -> None:
        """Overlay `run`; its history is drawn at once, then live points as they come (if `follow`).

        The history is read here, in the caller's thread, not by the follower: a view displayed right after (a
        notebook cell's `RunMonitor(*finished_runs)`) computes its static summary from `summaries` at once, and a
        finished run never changes state again to have it re-published (`ui.display`), so a summary still empty
        then stayed "step 0, applied none" in the saved notebook."""
        if run.id in self._runs:
            return
        self.summaries[run.id] = RunSummary()
        self._runs[run.id] = run
        history = self._read_history(run)
        self._draw_history(run.id, history)
        if follow:
            t = threading.Thread(
                target=self._follow, args=(run, history.stream.offset), daemon=True, name=f"ortlab-follow-{run.id}"
            )
            t.start()
            self._threads.append(t)
        else:
            self.flush()

    def _read_history(self, run: Any) -> History:
        """The run's records so far in one pass (`ortlab.runfolder.history`), folded into its summary."""
        return read_history(run.path, [name for name, _ in PANELS], EVAL_CURVES, summary=self.summaries[run.id])

    def _draw_history(self, run_id: str, history: History) -> None:
        """Draw a history read in one pass: each curve downsampled once, labelled as the live path would have left
        it (from the latest record that relabels, with the folded summary's accelerations where it has none)."""
        with self._lock:
            for (event, name), (xs, ys) in history.series.items():
                panel, kind = (name, "train") if event == events.STEP else (_panel_of(name), "eval")
                index, series = self._curve(run_id, panel, kind)
                series.extend(xs, ys)
                if name == "mfu" and not self.over_peak and any(over_peak(y) for y in ys):
                    self._flag_over_peak()
                self._changed.add(index)
                self.points_received += len(xs)
        relabels = [r for e, r in history.last.items() if e in _RELABEL]
        if relabels:
            self._relabel(run_id, relabels[-1])

    def _follow(self, run: Any, offset: int) -> None:
        for record in run.follow(poll_s=0.3, offset=offset):  # the live lines from where the history ended
            if self._stop.is_set():
                return
            self.consume(run.id, record)
        self.flush()
        self._set_status()
        if self.on_change is not None:
            self.on_change(final=True)

    def consume(self, run_id: str, record: dict[str, Any]) -> None:
        """Take one metrics record (from a stream or a recording); buffered until the next flush."""
        summary = self.summaries.get(run_id)
        if summary is not None:
            summary.fold(record)
        event = record.get("event")
        if event in _RELABEL:
            self._relabel(run_id, record)
            return
        step = as_float(record.get("step"))
        if step is None:  # (as a history is read: a string or a huge step is no point, not a crash)
            return
        points: list[tuple[str, str, Any]] = []
        if event == events.STEP:
            points = [(name, "train", record.get(name)) for name, _ in PANELS]
        elif event == events.EVAL:
            points = [(_panel_of(name), "eval", record.get(name)) for name in EVAL_CURVES]
        with self._lock:
            for panel, kind, value in points:
                if (value := as_float(value)) is not None:
                    if panel == "mfu" and over_peak(value) and not self.over_peak:
                        self._flag_over_peak()
                    index, series = self._curve(run_id, panel, kind)
                    series.add(step, value)
                    self._changed.add(index)
                    self.points_received += 1

    # --- drawing -----------------------------------------------------------------------------------------

    def _curve(self, run_id: str, panel: str, kind: str) -> tuple[int, LiveSeries]:
        """One run's curve in one panel: its trace index and its points (both made on its first point)."""
        index = self._trace(run_id, panel, kind)
        series = self._series.get(index)
        if series is None:
            series = self._series[index] = LiveSeries(self.max_points)
        return index, series

    def _trace(self, run_id: str, panel: str, kind: str) -> int:
        key = (run_id, f"{panel}/{kind}")
        if key not in self._traces:
            import plotly.graph_objects as go

            if panel in GPU_PANELS and panel not in self._with_data:
                self._with_data.add(panel)
                _arrange(self.figure, self._with_data)
                self._figure_changed = True
            index = [p for p, _ in PANELS].index(panel)
            row, col = index // 2 + 1, index % 2 + 1
            summary = self.summaries.get(run_id)
            label = run_label(None, run_id, summary.accelerations if summary is not None else None)
            # One colour per run across the panels (the legend, on the loss panel only, names them all).
            color = PALETTE[list(self._runs).index(run_id) % len(PALETTE)] if run_id in self._runs else None
            self.figure.add_trace(
                go.Scatter(
                    x=[],
                    y=[],
                    mode="lines+markers",
                    marker={"size": 4, "color": color},
                    name=f"{label} ({kind})" if panel == "loss" else label,
                    legendgroup=run_id,
                    showlegend=panel == "loss",
                    line={"color": color, "dash": "dot" if kind == "eval" else "solid"},
                ),
                row=row,
                col=col,
            )
            self._traces[key] = len(self.figure.data) - 1
            self._figure_changed = True
        return self._traces[key]

    def _flag_over_peak(self) -> None:
        """MFU over 100 % is impossible: the cached peak was measured under load. The MFU panel's title says so."""
        self.over_peak = True
        index = [p for p, _ in PANELS].index("mfu")
        title = self.figure.layout.annotations[index]
        title.text = f"{dict(PANELS)['mfu']}<br>{OVER_PEAK.replace('`', '')}"
        title.font = {"color": "#c07000", "size": 11}
        self._figure_changed = True

    def _relabel(self, run_id: str, record: dict[str, Any]) -> None:
        accelerations = record.get("accelerations")
        summary = self.summaries.get(run_id)
        if accelerations is None and summary is not None:
            # The folded summary says what the run folder would (without reading the whole file again).
            accelerations = summary.accelerations
        label = run_label(self._runs.get(run_id), run_id, accelerations)
        with self._lock:
            for (rid, what), index in self._traces.items():
                if rid == run_id:
                    kind = what.split("/")[1]
                    self.figure.data[index].name = f"{label} ({kind})" if what.startswith("loss") else label
                    self._figure_changed = True

    def flush(self) -> None:
        """Send the new points of the curves that got some, in one message (a curve whole only when redrawn)."""
        with self._lock:
            changed, self._changed = self._changed, set()
            if not changed:
                self._sync_figure()  # a relabel (the accelerations that applied) without new points
                return
            started = time.perf_counter()
            self._sync_figure()
            ops: list[Op] = [(index, *self._series[index].take()) for index in sorted(changed)]
            self.chart.send_points(ops)
            sent = sum(len(xs) for _, _, xs, _ in ops)
            self.updates_sent += 1
            self.points_sent += sent
            self.last_points_sent = sent
            self.chart.kernel_s += SMOOTHING * (time.perf_counter() - started - self.chart.kernel_s)
        self._set_status()
        if self.on_change is not None:
            self.on_change()

    def _sync_figure(self) -> None:
        if self._figure_changed:
            self.chart.set_figure(self.figure)
            self._figure_changed = False

    def _snapshot(self) -> list[Op]:
        """Every curve as drawn, for a view that just opened (or lost track): bounded by `max_points` a curve."""
        with self._lock:
            self._sync_figure()
            return [(index, 0, *series.points()) for index, series in sorted(self._series.items())]

    def drawn(self, run_id: str, panel: str = "loss", kind: str = "train") -> tuple[list[float], list[float]]:
        """The points of one curve as the browser draws them (at most `max_points` and the newest bucket's 3)."""
        with self._lock:
            index = self._traces.get((run_id, f"{panel}/{kind}"))
            return self._series[index].points() if index in self._series else ([], [])

    def series(self, run_id: str, panel: str = "loss", kind: str = "train") -> tuple[list[float], list[float]]:
        """Every point of one curve (steps, values) at full resolution, whatever was drawn: an export on demand.
        The run folder's metrics.jsonl holds the same and more (`run.metrics()`)."""
        with self._lock:
            index = self._traces.get((run_id, f"{panel}/{kind}"))
            return self._series[index].full() if index in self._series else ([], [])

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.chart.interval(self.throttle_s)):
            self.flush()

    def _set_status(self) -> None:
        parts = []
        for run in list(self._runs.values()):  # (a copy: add_run may add one from another thread meanwhile)
            try:
                state = run.state
            except Exception:  # a run folder removed under us: show it, do not break the monitor
                state = "missing"
            parts.append(f"<b>{html.escape(run.id)}</b>: {html.escape(str(state))}")
        self.status.value = " &nbsp; ".join(parts)

    def close(self) -> None:
        self._stop.set()
        self.chart.close()
        super().close()

    # --- where widgets cannot render -------------------------------------------------------------------------

    def _shown_runs(self) -> list[Any]:
        return list(self._runs.values())

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        html, text = static_summary(list(self._runs.values()), summaries=self.summaries)
        bundle["text/html"] = html
        bundle["text/plain"] = text
        return bundle

    def __repr__(self) -> str:
        return static_summary(list(self._runs.values()), summaries=self.summaries)[1]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """For tests and scripts: return when every followed run has ended and all points were sent."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.flush()
