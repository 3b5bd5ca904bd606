"""benchmarks/bench_gpu.py --smoke: the GPU benchmark's machinery on CPU (processes, interleaving, ratios, MFU
fields, rows that cannot run here listed with the reason). It measures nothing worth keeping: tiny shapes, CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_smoke_run_writes_rows_ratios_and_reasons(tmp_path):
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--output", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["device"] == "cpu"
    (suite,) = report["suites"]
    rows = {r["mix"]: r for r in suite["results"]}
    base, fused = rows["baseline"], rows["fused_adam"]
    assert base["throughput_ratio"] == 1.0 and base["samples_per_s"] > 0
    assert fused["applied"] == {"fused_adam": True} and len(fused["slices"]) == report["rounds"]
    lo, hi = fused["ratio_ci95"]
    assert lo <= fused["throughput_ratio"] <= hi
    for r in (base, fused):
        # MFU against the matmul peak measured on this machine; no datasheet peak exists for a CPU.
        assert r["mfu"] == pytest.approx(r["model_tflops_per_s"] / r["peak_measured_tflops"]) and r["mfu"] > 0
        assert r["mfu_datasheet"] is None and "no datasheet peak on cpu" in r["mfu_datasheet_absent"]
        assert r["model_tflops_per_s"] == pytest.approx(r["samples_per_s"] * suite["flops_per_sample"] / 1e12)
        assert r["peak_mem_mb"] > 0
    assert "TF32 is a tensor-core mode" in rows["tf32"]["skipped"]
    assert "fp16 needs a CUDA device" in rows["fp16"]["skipped"]
    # The FLOP count of the tiny BERT: 6 N s + 12 L h s^2 with N its parameters without the input embeddings.
    n = suite["model"]["matmul_params"]
    assert suite["flops_per_sample"] == 6 * n * 32 + 12 * 2 * 64 * 32 * 32
