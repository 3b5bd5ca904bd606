"""benchmarks/bench_lora_trl.py: the LoRA SmolLM2 job through ortlab against TRL's SFTTrainer.

trl is not one of ortlab's dependencies: the benchmark takes it from a folder of its own (`--trl-site`, or
`ORTLAB_TRL_SITE`), and without one says which package and which command before anything loads. The smoke run
needs that folder; it is skipped, saying so, where trl was not installed (the committed result comes from a real run,
benchmarks/results/lora-trl-2026-11-27.json).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

SCRIPT = ROOT / "benchmarks" / "bench_lora_trl.py"
TRL_SITE = Path(os.environ.get("ORTLAB_TRL_SITE", "/tmp/trl-site"))


def test_without_trl_it_names_the_package_and_the_command(tmp_path):
    done = subprocess.run(
        [PYTHON, str(SCRIPT), "--trl-site", str(tmp_path), "--output", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode != 0
    assert "trl is needed" in done.stderr and f"{str(tmp_path)!r} has no trl package" in done.stderr
    assert 'uv pip install --target /tmp/trl-site "trl==' in done.stderr and "--no-deps" in done.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow  # the embedded SmolLM2 in two training processes: a minute or more on a busy 2-core machine
@pytest.mark.multiprocess
@pytest.mark.skipif(
    not (TRL_SITE / "trl" / "__init__.py").is_file(),
    reason=f"trl is not installed in {TRL_SITE} (set ORTLAB_TRL_SITE; the command: bench_lora_trl.py's docstring)",
)
def test_the_smoke_run_trains_both_sides_and_writes_ratios_and_memory(tmp_path):
    out = tmp_path / "trl.json"
    done = subprocess.run(
        [PYTHON, str(SCRIPT), "--trl-site", str(TRL_SITE), "--smoke", "--output", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["packages"]["trl"]
    rows = {r["mix"]: r for r in report["results"]}
    assert set(rows) == {"trl", "ortlab"}
    for name, r in rows.items():
        assert "error" not in r, (name, r.get("error"))
        assert len(r["slices"]) == report["rounds"] and r["samples_per_s"] > 0
        assert r["peak_mem_mb"] > 100 and r["mem_kind"] == "cpu_peak_rss"
    assert rows["trl"]["throughput_ratio"] == pytest.approx(1.0)
    assert rows["ortlab"]["peak_mem_ratio"] == pytest.approx(rows["ortlab"]["peak_mem_mb"] / rows["trl"]["peak_mem_mb"])
    # Each side said what its defaults were: TRL's SFTConfig (bf16, gradient checkpointing), ortlab's auto decision.
    assert any("bf16=True gradient_checkpointing=True packing=False" in s for s in rows["trl"]["said"])
    assert any(s.startswith("[ortlab] auto:") for s in rows["ortlab"]["said"])
