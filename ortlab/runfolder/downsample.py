"""Fewer points that keep a curve's shape: what a chart draws of a long run, never what is stored.

A chart of 100,000 steps cannot show more than its width in pixels, yet sending and drawing every point costs the
kernel, the wire and the browser in proportion to the run's length. Taking every k-th point (`ortlab.ui.svg._thin`)
is bounded but blind: a loss spike or a throughput drop between two kept points disappears, and a reader misses the
one event they looked for. So the points are cut into buckets and each bucket keeps its minimum and its maximum
(the "min/max" decimation TensorBoard-like viewers use): the envelope of the curve survives exactly, and the first
and the last point are always kept (where the run started, and the number a reader of a live run wants).

Pure and standard-library only: the workbench's charts and the server's metrics route both use it, and the tests
check it exactly on small inputs. The full data stays in the run folder (metrics.jsonl); nothing here writes.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

from ortlab.safeio import real_number

MIN_POINTS = 4  # first, last, and at least one bucket's min and max


def _value(v: Any) -> float | None:
    """A number to compare, or None (missing, not a number, NaN, a bool): such points are never a bucket's
    extreme, so one damaged value cannot pin the envelope."""
    return real_number(v)


def _extremes_fast(column: Sequence[Any], lo: int, hi: int) -> tuple[int, int] | None:
    """The indices of the first minimum and the first maximum of column[lo:hi] found by C-level min/max, for a
    float array whose bucket holds only finite numbers (the sum is then finite; a NaN, an infinity or a sum that
    overflows sends the bucket to the careful loop, which gives the same answer for finite buckets)."""
    if not isinstance(column, array) or column.typecode not in "df":
        return None
    part = column[lo:hi]
    total = sum(part)
    if total - total != 0.0:
        return None
    return lo + part.index(min(part)), lo + part.index(max(part))


def keep_indices(columns: Sequence[Sequence[Any]], max_points: int) -> list[int]:
    """Indices (ascending) of the points to keep so that at most `max_points` remain, keeping for each bucket of
    consecutive points the minimum and the maximum of every column (columns are parallel series: the loss and the
    samples/s of the same records, say), plus the first and the last point. All indices when they already fit.

    Buckets hold equal counts of points (±1), so each covers the same number of records whatever their values.
    """
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, got {max_points}")
    if not columns:
        return []
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError("every column must have as many points as the first")
    if n <= max_points:
        return list(range(n))
    per_bucket = 2 * len(columns)  # a min and a max for each column
    buckets = max(1, (max_points - 2) // per_bucket)
    if buckets * per_bucket + 2 > max_points:  # more columns than the bound allows: keep the first column only
        return keep_indices(columns[:1], max_points)
    inner = n - 2
    kept = {0, n - 1}
    for b in range(buckets):
        lo = 1 + b * inner // buckets
        hi = 1 + (b + 1) * inner // buckets
        if lo >= hi:
            continue
        for column in columns:
            if (fast := _extremes_fast(column, lo, hi)) is not None:
                kept.update(fast)
                continue
            low = high = None
            low_i = high_i = lo
            for i in range(lo, hi):
                v = _value(column[i])
                if v is None:
                    continue
                if low is None or v < low:
                    low, low_i = v, i
                if high is None or v > high:
                    high, high_i = v, i
            kept.add(low_i)
            kept.add(high_i)
    return sorted(kept)


def downsample(xs: Sequence[Any], ys: Sequence[Any], max_points: int) -> tuple[list[Any], list[Any]]:
    """(xs, ys) reduced to at most `max_points` points by `keep_indices` (min and max per bucket, first, last)."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} and {len(ys)})")
    keep = keep_indices([ys], max_points)
    return [xs[i] for i in keep], [ys[i] for i in keep]


class LiveSeries:
    """One growing curve, drawn with at most `bound` points (+3 for the newest, unfinished bucket) at any length,
    for a chart that is refreshed while the run goes on.

    Until the curve has `bound` points every point is drawn. Past that, it is redrawn downsampled to `bound // 2`
    points once, and new points are then folded into buckets of k points (each finished bucket adds its min and
    max) sized so that the drawn count reaches `bound` when the curve's length has doubled; then it is redrawn
    again. So a redraw (work in the run's length) happens only each time the length doubles, and adding a point
    costs O(1) amortized: a refresh's work depends on `bound`, not on how long the run is.

    The unfinished bucket keeps its running minimum and maximum (not its points): its min, max and last point are
    drawn provisionally, and reading them costs the same whether the bucket holds 1 point or 400. `take()` gives a
    chart only what changed since it last asked: the finished points it lacks and the provisional tail.

    The full series is kept (compact `array`s) for those redraws and for `full()`; the run folder keeps it anyway.
    """

    def __init__(self, bound: int = 1000):
        if bound < 2 * MIN_POINTS:
            raise ValueError(f"bound must be at least {2 * MIN_POINTS}, got {bound}")
        self.bound = bound
        self.xs: Any = array("d")
        self.ys: Any = array("d")
        self._drawn_x: list[float] = []
        self._drawn_y: list[float] = []
        self._k = 1  # points per bucket (1: every point is drawn)
        self._redraw_at = bound  # the length past which the curve is redrawn downsampled
        self.redraws = 0  # how many times the whole curve was redrawn (what tests and benchmarks count)
        # The unfinished bucket: how many points, and the indices (into xs/ys) of its min, max and last point.
        self._count = 0
        self._low = self._high = self._last = -1
        self._taken = 0  # finished points a chart was given by take()
        self._taken_redraws = 0  # ... since the redraw it saw last

    def __len__(self) -> int:
        return len(self.xs)

    def add(self, x: float, y: float) -> None:
        self.xs.append(float(x))
        self.ys.append(float(y))
        n = len(self.xs)
        if n > self._redraw_at:
            self._redraw()
            return
        i = n - 1
        v = _value(self.ys[i])
        if self._count == 0:
            self._low = self._high = i
        elif v is not None:
            low, high = _value(self.ys[self._low]), _value(self.ys[self._high])
            if low is None or v < low:
                self._low = i
            if high is None or v > high:
                self._high = i
        self._last = i
        self._count += 1
        if self._count >= self._k:
            for j in self._tail(last=self._k == 1):
                self._drawn_x.append(self.xs[j])
                self._drawn_y.append(self.ys[j])
            self._count = 0

    def extend(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Add many points at once (a run's history when a chart opens): on an empty series past the bound, one
        downsampling pass over them all (O(n) once, in C for finite floats) instead of a point at a time."""
        if len(xs) != len(ys):
            raise ValueError(f"xs and ys differ in length ({len(xs)} and {len(ys)})")
        if len(self.xs) or len(xs) <= self.bound:
            for x, y in zip(xs, ys, strict=True):
                self.add(x, y)
            return
        self.xs.extend(array("d", xs))
        self.ys.extend(array("d", ys))
        self._redraw()

    def _tail(self, last: bool) -> list[int]:
        """The unfinished bucket's points to draw: its min and max (and its last, if `last`), ascending."""
        if self._count == 0:
            return []
        keep = {self._low, self._high}
        if last:
            keep.add(self._last)
        return sorted(keep)

    def _redraw(self) -> None:
        n = len(self.xs)
        self._drawn_x, self._drawn_y = downsample(self.xs, self.ys, self.bound // 2)
        # The drawn count may grow by bound/2 before the length doubles: two points per bucket of k.
        self._k = max(1, math.ceil(4 * n / self.bound))
        self._redraw_at = 2 * n
        self._count = 0
        self.redraws += 1

    def points(self) -> tuple[list[float], list[float]]:
        """What to draw: the finished buckets and, of the unfinished one, its min, max and last point."""
        xs, ys = list(self._drawn_x), list(self._drawn_y)
        for i in self._tail(last=True):
            xs.append(self.xs[i])
            ys.append(self.ys[i])
        return xs, ys

    def take(self) -> tuple[int, list[float], list[float]]:
        """What a chart that holds what the last `take()` gave must change: (keep, xs, ys) says keep your first
        `keep` points (drop the provisional tail after them) and append (xs, ys). `keep` is 0 after a redraw:
        replace the curve. Costs the new points, not the curve's length (but for the redraw, once per doubling)."""
        if self._taken_redraws != self.redraws:
            self._taken_redraws, self._taken = self.redraws, 0
        keep = self._taken
        xs, ys = self._drawn_x[keep:], self._drawn_y[keep:]
        for i in self._tail(last=True):
            xs.append(self.xs[i])
            ys.append(self.ys[i])
        self._taken = len(self._drawn_x)
        return keep, xs, ys

    def full(self) -> tuple[list[float], list[float]]:
        """Every point added, in order (an export of what was drawn, at full resolution)."""
        return list(self.xs), list(self.ys)
