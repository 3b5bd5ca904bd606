"""benchmarks/bench_dpo_trl.py: the LoRA DPO job through ortlab's PreferenceTrainer against TRL's DPOTrainer.

trl is not one of ortlab's dependencies: the benchmark takes it from a folder of its own (`--trl-site`,
`ORTLAB_TRL_SITE`, or test-artifacts/trl-site, which tests/helpers/trlsite.py fills once per clone), and without
one says which package and which command before anything loads. The committed result comes from a real run
(benchmarks/results/dpo-trl-*.json); the smoke run here checks the script and the report's shape, not speed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
from conftest import PYTHON, ROOT
from trlsite import trl_site

SCRIPT = ROOT / "benchmarks" / "bench_dpo_trl.py"


def test_without_trl_it_names_the_package_and_the_command(tmp_path):
    done = subprocess.run(
        [PYTHON, str(SCRIPT), "--trl-site", str(tmp_path), "--output", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode != 0
    assert "bench_dpo_trl: trl is needed" in done.stderr and f"{str(tmp_path)!r} has no trl package" in done.stderr
    assert 'uv pip install --target test-artifacts/trl-site "trl==' in done.stderr and "--no-deps" in done.stderr
    assert "benchmarks/bench_dpo_trl.py --trl-site test-artifacts/trl-site" in done.stderr
    assert not (tmp_path / "x.json").exists()


def _number(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.mark.slow  # the embedded SmolLM2 in three training processes: minutes on a busy 2-core machine
@pytest.mark.multiprocess
def test_the_smoke_run_trains_every_row_and_writes_paired_ratios_memory_and_the_first_step(tmp_path):
    out = tmp_path / "dpo.json"
    site = trl_site()
    done = subprocess.run(
        [PYTHON, str(SCRIPT), "--trl-site", str(site), "--smoke", "--output", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["packages"]["trl"] and report["benchmark"] == "bench_dpo_trl"
    assert report["loss"] == {"type": "sigmoid (DPO)", "beta": 0.1} and report["ortlab_precision"] == "fp32"
    assert all(_number(x) for x in report["load_average_before"] + report["load_average_after"])
    assert set(report["settings"]) == {"ortlab", "trl", "trl_equal"} and "fp32" in report["settings"]["trl_equal"]
    rows = {r["mix"]: r for r in report["results"]}
    assert set(rows) == {"trl", "ortlab", "trl_equal"}
    for name, r in rows.items():
        assert "error" not in r, (name, r.get("error"))
        assert len(r["slices"]) == report["rounds"] and r["samples_per_s"] > 0
        assert r["peak_mem_mb"] > 100 and r["mem_kind"] == "cpu_peak_rss"
        # the ratios are measured numbers with an interval around them, not constants written in
        lo, hi = r["ratio_ci95"]
        assert _number(r["throughput_ratio"]) and _number(lo) and _number(hi) and lo <= r["throughput_ratio"] <= hi
        paired = sorted(x / y for x, y in zip(r["slices"], rows["trl"]["slices"], strict=True))
        assert r["throughput_ratio"] == pytest.approx(sum(paired) / 2)  # the median of the two rounds' ratios
        assert r["peak_mem_ratio"] == pytest.approx(r["peak_mem_mb"] / rows["trl"]["peak_mem_mb"])
        # each row trained its first step on the same DPO job: the adapter starts at zero, so the policy is the
        # reference and the loss is log 2
        assert r["first_step"]["loss"] == pytest.approx(math.log(2), abs=1e-4), (name, r["first_step"])
    assert rows["trl"]["throughput_ratio"] == pytest.approx(1.0)
    ortlab, equal = rows["ortlab"], rows["trl_equal"]  # ortlab against TRL at equal settings, paired too
    paired = sorted(x / y for x, y in zip(ortlab["slices"], equal["slices"], strict=True))
    assert ortlab["ratio_to_trl_equal"] == pytest.approx(sum(paired) / 2)
    lo, hi = ortlab["ratio_to_trl_equal_ci95"]
    assert _number(lo) and _number(hi) and lo <= ortlab["ratio_to_trl_equal"] <= hi
    assert ortlab["peak_mem_ratio_to_trl_equal"] == pytest.approx(ortlab["peak_mem_mb"] / equal["peak_mem_mb"])
    # Each side said its settings: TRL's DPOConfig defaults (bf16 off in the smoke run), trl_equal's, ortlab's.
    assert any("gradient_checkpointing=True optim=adamw_torch loss_type=['sigmoid']" in s for s in rows["trl"]["said"])
    assert any("gradient_checkpointing=False optim=adamw_torch_fused" in s for s in rows["trl_equal"]["said"])
    assert any(s.startswith("[ortlab] reference=adapter optim=adamw_torch_fused") for s in rows["ortlab"]["said"])
    assert any(s.endswith("prompt_shared=True") for s in rows["ortlab"]["said"])  # each prompt run once
    # Both sides trained the same first batch: the policy's log-probabilities agree (fp32 on both here).
    check = report["first_step_check"]
    assert check["loss_abs_diff"] < 1e-4
    assert check["logps_chosen_abs_diff"] < 1e-2 and check["logps_rejected_abs_diff"] < 1e-2, check
