"""A run's history in one pass: the numbers a chart draws, as compact columns, and the run's summary.

Opening the charts of a finished 100,000-step run took 3.2 s, most of it spent handing each record to the live
path one at a time (per record: a fold, a dispatch, six lookups of its trace, six single-point appends). A history
is not live: it is read once, to the end of the file as it is now, in the stream's bounded pieces (memory: one
piece, plus 16 bytes a point kept), into one float array of steps and one of values per curve, folded into a
`RunSummary` on the way. The view then draws each curve from its arrays in one downsampling pass (`LiveSeries.
extend`) and follows the run on from `stream.offset`, where every refresh costs what the new lines cost.

What counts as a point is the live path's rule: a step (or eval) record whose `step` is a number, and a value
that is a number (not a bool, not None: the stream has already turned NaN and infinities into None). An integer
too large for a float is left out rather than stopping the whole chart.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ortlab.runfolder import events
from ortlab.runfolder.stream import METRICS_FILE, MetricsStream, RunSummary


@dataclass
class History:
    """What `read_history` found: per (event, field), in the order each curve got its first point, the steps and
    the values; the summary of every record; the last record of each event that is not a step or an eval, the
    most recent last (a view's labels come from the latest train_begin / verified / train_end); and the stream,
    positioned at the end of what was read, to follow the run on from."""

    series: dict[tuple[str, str], tuple[array, array]]
    summary: RunSummary
    last: dict[str, dict[str, Any]]
    stream: MetricsStream
    records: int = 0
    points: int = 0


def as_float(value: Any) -> float | None:
    """A chart's number: a float from an int or a float (not a bool), None for anything else or an integer too
    large for a float. The live path and the history share it, so both draw the same points."""
    kind = type(value)
    if kind is float:
        return value
    if kind is int or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def read_history(
    folder: str | os.PathLike,
    step_fields: Sequence[str],
    eval_fields: Sequence[str] = (),
    summary: RunSummary | None = None,
    name: str = METRICS_FILE,
    max_bytes: int | None = None,
) -> History:
    """Read a run's metrics from the start up to now (at most about `max_bytes`; None: the whole file, in bounded
    pieces): the `step_fields` of step records and the `eval_fields` of eval records as columns, every record
    folded into `summary` (a new one if None)."""
    summary = RunSummary() if summary is None else summary
    stream = MetricsStream(folder, name=name)
    series: dict[tuple[str, str], tuple[array, array]] = {}
    wanted = {events.STEP: list(step_fields), events.EVAL: list(eval_fields)}
    columns = {event: [(f, array("d"), array("d")) for f in fields] for event, fields in wanted.items()}
    last: dict[str, dict[str, Any]] = {}
    count = points = 0
    fold = summary.fold
    for record in stream.records(max_bytes):
        count += 1
        fold(record)
        event = record.get("event")
        cols = columns.get(event) if isinstance(event, str) else None
        if cols is None:
            if isinstance(event, str):
                last.pop(event, None)  # (re-inserted: `last` is ordered by when each event was last seen)
                last[event] = record
            continue
        x = as_float(record.get("step"))
        if x is None:
            continue
        for name_, xs, ys in cols:
            y = record.get(name_)
            if type(y) is not float and (y := as_float(y)) is None:  # (the check inline: it runs per point)
                continue
            if not xs:
                series[(event, name_)] = (xs, ys)  # in the order of each curve's first point
            xs.append(x)
            ys.append(y)
            points += 1
    summary.skipped, summary.skips = stream.skipped, list(stream.skips)
    return History(series=series, summary=summary, last=last, stream=stream, records=count, points=points)
