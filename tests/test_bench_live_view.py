"""benchmarks/bench_live_view.py runs end to end in its --smoke mode (100 and 1,000 steps, in process) and writes the
JSON the committed results have, the opening and many-runs cases included; what it measures must also hold: a
refresh's points bounded by the charts' max_points, the unbounded path sending more on the longer run, the route's
max_points honoured."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT


def test_the_live_view_benchmark_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_live_view", ROOT / "benchmarks" / "bench_live_view.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_live_view", bench)
    spec.loader.exec_module(bench)
    out = tmp_path / "live.json"
    report = bench.main(["--smoke", "--out", str(out)])
    assert out.is_file() and report["benchmark"] == "bench_live_view" and report["smoke"] is True
    bound = report["chart_max_points"]
    short, long = report["charts"]["100"], report["charts"]["1000"]
    for row in (short, long):
        assert row["after"]["points_per_refresh_max"] <= 4 * (bound + 3)
        assert row["after"]["bytes_per_refresh_max"] > 0 and row["after"]["refresh_ms_p50"] > 0
    # The old path sent every point of every curve: 1,000 steps cost it more than 100 did.
    assert long["before"]["points_per_refresh_max"] > short["before"]["points_per_refresh_max"]
    route = report["route"]["1000"]
    assert route["sidebar_200"]["steps_sent"] <= 200 < route["at_limit"]["steps_sent"] == 1000
    assert route["sidebar_200"]["payload_bytes"] < route["at_limit"]["payload_bytes"]
    opening = report["opening_longest"]
    assert all(len(opening[k]) == 2 and min(opening[k]) > 0 for k in opening)
    many = report["many_runs"]
    assert many["runs"] == 4 and many["sidebar"]["list_open_requests"] >= 1
    assert many["sidebar"]["metrics_live_refresh_ms_p50"] > 0 and many["workbench"]["compare_open_cpu_s"] > 0
