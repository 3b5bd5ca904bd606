"""Reading ortlab's static SVG charts back, for tests: which points a curve draws, and whether they are the data."""

from __future__ import annotations

import html
import re


def series(page: str) -> dict[str, list[tuple[float, float]]]:
    """Every curve in `page` (HTML holding ortlab's inline SVG): legend label -> its (x, y) pixel points. Attributes
    in any order: nbconvert's HTML writes them sorted."""
    out = {}
    for tag in re.findall(r"<path\b[^>]*>", page):
        attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        if attributes.get("class") != "ortlab-series":
            continue
        points = [tuple(map(float, p.split(","))) for p in attributes["d"].lstrip("M").split(" L")]
        out[html.unescape(attributes["data-label"])] = points
    return out


def assert_drawn(pixels: list[float], values: list[float], increasing: bool, tolerance: float = 0.3) -> None:
    """The pixels are an affine image of the values (what a chart axis is), growing with them (`increasing`) or
    shrinking (SVG's y grows downwards: a higher loss is drawn higher, at a smaller y)."""
    assert len(pixels) == len(values), (len(pixels), len(values))
    i, j = values.index(min(values)), values.index(max(values))
    assert values[i] != values[j], "need two different values to tell"
    slope = (pixels[j] - pixels[i]) / (values[j] - values[i])
    assert (slope > 0) == increasing, slope
    for p, v in zip(pixels, values, strict=True):
        assert abs(pixels[i] + slope * (v - values[i]) - p) <= tolerance, (p, v)
