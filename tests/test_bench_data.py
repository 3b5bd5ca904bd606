"""benchmarks/bench_data.py runs end to end (its --smoke mode: 2,000 generated rows through the eager, lazy and
streamed paths, one `ortlab train` process each; reviews for a classifier, or conversations for a causal LM) and
writes the JSON its committed results have."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT


@pytest.mark.slow  # three training processes that import torch: ~1 min on a busy 2-core machine
@pytest.mark.multiprocess
@pytest.mark.parametrize("task", ["classification", "chat"])
def test_the_data_benchmark_writes_time_to_first_step_per_path(task, tmp_path):
    out = tmp_path / "data.json"
    proc = subprocess.run(
        [PYTHON, str(ROOT / "benchmarks" / "bench_data.py"), "--smoke", "--task", task, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "bench_data" and report["smoke"] is True and report["task"] == task
    rows = {r["path"]: r for r in report["results"]}
    assert set(rows) == {"eager", "lazy", "stream"} | ({"trainer"} if task == "classification" else set())
    for path, row in rows.items():
        assert "error" not in row, (path, row.get("error"))
        assert row["rows"] == 2000 and 0 < row["first_step_s"] < row["total_s"]
        assert row["peak_mem_mb"] > 0 and row["load_and_check_s"] > 0
        assert 0 < row["peak_anon_mb"] <= row["peak_mem_mb"], "the owned memory is part of the resident peak"
    # Measured, not assumed: the eager path tokenizes the whole training split before step 1, the lazy ones do not
    # (their tokenize only wraps the splits; the rows are tokenized inside the steps).
    assert rows["lazy"]["tokenize_s"] < rows["eager"]["tokenize_s"]
    # Training speed once started, each path against the eager one of the same size (the preparation keeps ahead).
    assert all(row["steady_samples_per_s"] > 0 for row in rows.values())
    assert (
        rows["lazy"]["throughput_vs_eager"]
        == rows["lazy"]["steady_samples_per_s"] / rows["eager"]["steady_samples_per_s"]
    )
    if task == "classification":  # each ortlab path beside the same job in plain transformers
        assert rows["lazy"]["first_step_vs_trainer"] == rows["lazy"]["first_step_s"] / rows["trainer"]["first_step_s"]
