"""benchmarks/bench_live_browser.py runs end to end in its --smoke mode (JupyterLab, chromium, one round of short
runs watched and unwatched, a 2,000-step run followed) and writes the JSON the committed results have. What it
reads must be real: the watched run's chart drew points in the page, the browser reported its drawing times to
the kernel, the followed run's refreshes carried its new points only, the sidebar followed its run to the last
step, and it opened a 100- and a 100,000-step run whole."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_live_browser_benchmark_writes_its_report(tmp_path, load_benchmark):
    bench = load_benchmark("bench_live_browser")
    out = tmp_path / "live-browser.json"
    report = bench.main(["--smoke", "--out", str(out)])
    assert out.is_file() and report["benchmark"] == "bench_live_browser" and report["smoke"] is True
    # No script error in any of its pages (tests/helpers/page_errors.py: the live chart threw in each, #42).
    assert report["page_errors"] == [], "\n\n".join(report["page_errors"])
    (row,) = report["rounds"]
    assert row["watched"]["samples_per_s"] > 0 and row["unwatched"]["samples_per_s"] > 0 and row["ratio"] > 0
    assert row["watched"]["points_drawn"] > 0  # the workbench's chart drew the watched run in the page
    assert row["page_open"]["samples_per_s"] > 0 and row["ratio_page_open"] > 0  # the floor: a page alone
    # The sidebar arm: the panel followed the unwatched run from its first step to its last.
    side = row["sidebar"]
    assert side["samples_per_s"] > 0 and row["ratio_sidebar"] > 0 and report["ratio_sidebar_mean"] > 0
    assert side["sidebar_first_step"] == 1 and side["sidebar_last_step"] == report["run"]["hyper"]["max_steps"]
    assert side["server_cpu_s"] > 0 and side["chromium_cpu_s"] > 0  # the panel's polls, answered by the server
    # The sidebar opened each run whole, in a bounded number of points.
    opened = report["sidebar_open"]
    assert opened["lengths"] == [100, 100_000]
    for n in ("100", "100000"):
        assert len(opened["seconds"][n]) == 1 and 0 < opened["seconds_median"][n] < 120, opened
        assert 10 <= opened["points_drawn"][n] <= 400, opened
    follow = report["follow"]
    assert follow["render_refreshes"] > 0 and follow["render_ms_p50"] > 0  # timed in the browser, per refresh
    assert follow["refreshes"] > 0 and follow["steps_at_end"] > follow["steps_at_start"]
    # 4 curves, each with at most its new steps and the newest bucket's 3 points: not the curve's 1,000 drawn.
    assert 0 < follow["points_per_refresh"] <= 4 * (follow["steps_per_refresh"] + 3) + 4
    assert 0.5 <= follow["interval_s"] <= 5.0
    assert follow["frames"] > 0
