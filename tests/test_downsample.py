"""The downsampler behind every long chart: exact on small inputs, bounded at any length, extremes kept."""

from __future__ import annotations

import math
import random

import pytest

from ortlab.runfolder.downsample import LiveSeries, downsample, keep_indices


def test_small_inputs_are_kept_whole():
    assert keep_indices([[3, 1, 2]], 4) == [0, 1, 2]
    assert downsample([1, 2, 3, 4], [0.5, 0.4, 0.3, 0.2], 4) == ([1, 2, 3, 4], [0.5, 0.4, 0.3, 0.2])
    assert keep_indices([[]], 10) == []


def test_exact_min_and_max_per_bucket():
    ys = [5, 9, 1, 4, 7, 2, 8, 3, 6, 0]
    # 10 points into 6: first, last, and 2 buckets of the 8 inner points (1..4, 5..8), each its min and max.
    assert keep_indices([ys], 6) == [0, 1, 2, 5, 6, 9]
    # Two columns: each bucket keeps both columns' extremes.
    other = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    other[3] = 100
    assert 3 in keep_indices([ys, other], 10 - 1)


def test_bounded_output_and_extremes_at_any_length():
    rng = random.Random(0)
    for n in (10, 999, 10_000, 100_001):
        ys = [rng.gauss(0, 1) for _ in range(n)]
        spike = rng.randrange(1, n - 1)
        ys[spike] = 50.0  # a loss spike that every-k-th thinning would usually miss
        ys[(spike + n // 2) % (n - 2) + 1] = -50.0
        for bound in (4, 100, 1000):
            xs, kept = downsample(list(range(n)), ys, bound)
            assert len(kept) <= bound
            assert max(kept) == 50.0 and min(kept) == -50.0
            assert xs[0] == 0 and xs[-1] == n - 1  # first and last always
            assert xs == sorted(xs)


def test_bad_values_never_pin_the_envelope_and_bad_bounds_are_refused():
    ys = [1.0, float("nan"), None, 3.0, True, 2.0, "x", 0.5] * 3
    kept = [ys[i] for i in keep_indices([ys], 6)]
    inner = [v for v in kept[1:-1] if isinstance(v, float) and not math.isnan(v)]
    assert 3.0 in inner and 0.5 in inner
    with pytest.raises(ValueError, match="at least"):
        keep_indices([[1, 2, 3]], 3)
    with pytest.raises(ValueError, match="differ"):
        downsample([1, 2], [1], 10)


def test_live_series_stays_bounded_and_redraws_only_when_the_length_doubles():
    series = LiveSeries(bound=100)
    sizes = []
    for i in range(20_000):
        series.add(i, math.sin(i / 50) + (10 if i == 12_345 else 0))
        if i % 37 == 0:
            sizes.append(len(series.points()[0]))
    assert max(sizes) <= 100 + 3
    xs, ys = series.points()
    assert max(ys) >= 10  # the spike survived the buckets
    assert xs[-1] == 19_999  # the newest point is drawn
    assert xs == sorted(xs)
    # Redraws at 101, 202, 404, ... 12,928 points: 8 for 20,000 points, not one per point or per refresh.
    assert series.redraws == 8
    full_x, full_y = series.full()
    assert len(full_x) == 20_000 and full_y[12_345] > 10  # every point is still there for an export


def test_live_series_draws_every_point_while_it_fits():
    series = LiveSeries(bound=50)
    for i in range(50):
        series.add(i, float(i))
    assert series.points() == ([float(i) for i in range(50)], [float(i) for i in range(50)])
    assert series.redraws == 0


def test_take_gives_a_chart_only_what_changed_and_the_chart_matches_the_curve():
    """A chart that applies each `take()` (keep the first `keep` points, append the rest) holds exactly what
    `points()` would draw, at every step and across redraws; and, but for the refreshes right after a redraw, each
    take carries the new finished points and a provisional tail of at most 3, however long the curve is."""
    series = LiveSeries(bound=60)
    chart_x: list[float] = []
    chart_y: list[float] = []
    sizes = []
    for i in range(5_000):
        series.add(i, math.cos(i / 30) * (1 + i % 7) + (50 if i == 3_333 else 0) + (math.nan if i == 777 else 0))
        if i % 3 == 2:
            redraws = series.redraws
            keep, xs, ys = series.take()
            assert keep <= len(chart_x)
            del chart_x[keep:], chart_y[keep:]
            chart_x += xs
            chart_y += ys
            assert (chart_x, chart_y) == series.points()
            if keep and series.redraws == redraws:
                sizes.append(len(xs))
    assert max(sizes) <= 3 + 3  # 3 new points, at most 2 finished buckets' min and max... and the tail
    assert max(chart_y) == max(y for y in series.full()[1] if not math.isnan(y)) > 40  # the spike is drawn
