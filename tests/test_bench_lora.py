"""benchmarks/bench_lora.py runs end to end (its --smoke mode: a tiny Llama, two processes, a few steps) and writes
the JSON the committed results have: ratios against full fine-tuning, trainable parameters, optimizer state."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT


@pytest.mark.slow  # two training processes that import torch: ~30 s on a busy 2-core machine
@pytest.mark.multiprocess
def test_the_lora_benchmark_writes_its_ratios(tmp_path):
    out = tmp_path / "lora.json"
    proc = subprocess.run(
        [PYTHON, str(ROOT / "benchmarks" / "bench_lora.py"), "--smoke", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "bench_lora" and report["smoke"] is True
    rows = {r["mix"]: r for r in report["results"]}
    full, lora = rows["full"], rows["lora"]
    assert "error" not in full and "error" not in lora, (full.get("error"), lora.get("error"))
    assert full["throughput_ratio"] == pytest.approx(1.0)
    assert lora["throughput_ratio"] > 0 and len(lora["slices"]) == report["rounds"]
    # What an adapter saves is measured, not assumed: fewer trainable parameters, a smaller optimizer state.
    assert lora["total"] == full["total"] + lora["trainable"]  # the adapter's matrices join the frozen model
    assert 0 < lora["trainable"] < full["trainable"] / 10
    assert full["trainable"] == full["total"]
    assert lora["optimizer_state_ratio"] == pytest.approx(lora["trainable"] / full["trainable"], rel=0.01)
    assert lora["peak_mem_mb"] > 0 and full["peak_mem_mb"] > 0
