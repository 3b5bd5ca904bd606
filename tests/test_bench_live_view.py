"""benchmarks/bench_live_view.py runs end to end in its --smoke mode (100 and 1,000 steps, in process) and writes the
JSON the committed results have, the opening and many-runs cases included; what it measures must also hold: a
refresh sends the new points only, as many bytes on the longer run as on the shorter one, and the route's
max_points honoured."""

from __future__ import annotations


def test_the_live_view_benchmark_writes_its_report(tmp_path, load_benchmark):
    bench = load_benchmark("bench_live_view")
    out = tmp_path / "live.json"
    report = bench.main(["--smoke", "--out", str(out)])
    assert out.is_file() and report["benchmark"] == "bench_live_view" and report["smoke"] is True
    bound = report["chart_max_points"]
    short, long = report["charts"]["100"], report["charts"]["1000"]
    for row in (short, long):
        # 2 new steps a refresh on 4 curves: the new points and the newest bucket's, never a curve's 1,000.
        assert row["after"]["points_per_refresh_max"] <= 4 * (2 + 3) < bound
        assert row["after"]["bytes_per_refresh_max"] > 0 and row["after"]["refresh_ms_p50"] > 0
    # Only a curve whose length doubled past the bound is sent whole: the 1,000-step run's first refresh does.
    assert short["after"]["whole_curve_refreshes"] == 0 and long["after"]["whole_curve_refreshes"] == 1
    # What a refresh sends does not grow with the run (the step numbers' digits aside).
    assert long["after"]["bytes_per_refresh_max"] <= short["after"]["bytes_per_refresh_max"] + 100
    assert long["after"]["snapshot_points"] > short["after"]["snapshot_points"]  # a view that opens gets the curves
    route = report["route"]["1000"]
    assert route["sidebar_200"]["steps_sent"] <= 200 < route["at_limit"]["steps_sent"] == 1000
    assert route["sidebar_200"]["payload_bytes"] < route["at_limit"]["payload_bytes"]
    opening = report["opening_longest"]
    assert all(len(opening[k]) == 2 and min(opening[k]) > 0 for k in opening)
    many = report["many_runs"]
    assert many["runs"] == 4 and many["sidebar"]["list_open_requests"] >= 1
    assert many["sidebar"]["metrics_live_refresh_ms_p50"] > 0 and many["workbench"]["compare_open_cpu_s"] > 0
