"""A new user's first minutes on a CPU without bf16 hardware (issue #42), simulated on any machine for real.

Many cloud CPUs (AMD EPYCs without avx512_bf16, older Xeons) have no bf16 units: a bf16 matmul there runs 10-100x
slower than fp32. On such a machine the doctor's fixed-size peak probe timed out on every call, a timed-out group kept
the whole report out of the cache, and every launch waited minutes for probes. The simulation is real where it
matters: oneDNN's bf16 kernels are switched off (`ONEDNN_MAX_CPU_ISA=AVX2`: a bf16 matmul then really runs ~100x
slower than fp32 here) and ortlab's view of the CPU's flags loses avx512_bf16 and amx_bf16 (`ORTLAB_HIDE_CPU_FLAGS`,
`ortlab.cpuinfo`), so the probes, the peak and the precision rules all see that CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON

from ortlab import probe
from ortlab.cpuinfo import BF16_FLAGS, HIDE_ENV
from ortlab.probe import cache as answers
from ortlab.probe.groups import ALL

pytestmark = pytest.mark.slow

ORTLAB = str(Path(PYTHON).parent / "ortlab")
NO_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2", HIDE_ENV: ",".join(BF16_FLAGS)}


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> dict[str, str]:
    """The environment of the simulated CPU, with a doctor cache of its own and no second runtime (the compile
    runtime's doctor is tested in test_doctor.py)."""
    folder = tmp_path_factory.mktemp("no-bf16")
    return {**NO_BF16, "ORTLAB_CACHE_DIR": str(folder / "cache"), "ORTLAB_RUNTIMES_DIR": str(folder / "runtimes")}


@pytest.fixture(scope="module")
def cold(machine) -> dict:
    """`ortlab doctor --json` on the simulated CPU, from an empty cache."""
    out = subprocess.run(
        [ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=300, env={**os.environ, **machine}
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["cached"] is False
    return report


def test_every_group_lands_in_the_cache(cold, machine, monkeypatch):
    assert {g: a["outcome"] for g, a in cold["groups"].items()} == dict.fromkeys(ALL, "ok"), cold["groups"]
    assert cold["notes"] == [], cold["notes"]
    for key, value in machine.items():
        monkeypatch.setenv(key, value)
    facts = probe.fingerprint()
    assert all(answers.read(facts, g) is not None and answers.read(facts, g).ok for g in ALL)


def test_bf16_is_measured_briefly_and_recorded_as_emulated(cold):
    bf16 = cold["peaks"]["precisions"]["bf16"]
    fp32 = cold["peaks"]["precisions"]["fp32"]
    assert bf16["hardware"] is False and fp32["hardware"] is True, cold["peaks"]
    assert bf16["flops"] * 10 < fp32["flops"], "the simulation is real: bf16 matmuls are emulated, >10x slower"
    assert bf16["size"] < fp32["size"], "the emulated precision's side stopped growing where a call got long"
    row = cold["accelerations"]["bf16"]
    assert row["available"] and row["slow"] and "no hardware support" in row["reason"], row


def test_a_warm_doctor_answers_from_its_cache_in_under_a_second(cold, machine, monkeypatch):
    for key, value in machine.items():
        monkeypatch.setenv(key, value)

    def no_probe(python: str, group: str):
        raise AssertionError(f"a probe was started ({group})")

    monkeypatch.setattr(probe, "start_probe", no_probe)
    warm = probe.doctor()
    assert warm.cached and warm.to_dict()["accelerations"] == cold["accelerations"]
    assert warm.elapsed_s <= 1.0, f"a warm doctor took {warm.elapsed_s:.2f} s"
    # The command, in its own process, answers from the same cache (its wall time, Python's start included, is
    # measured by benchmarks/bench_first_minutes.py).
    out = subprocess.run(
        [ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=60, env={**os.environ, **machine}
    )
    assert out.returncode == 0 and json.loads(out.stdout)["cached"] is True, out.stderr
    assert "probing" not in out.stderr, out.stderr


def test_auto_keeps_fp32_on_this_cpu(cold, machine, monkeypatch):
    from ortlab.accel import precision
    from ortlab.accel.mix import resolve
    from ortlab.spec import AccelSpec
    from ortlab.tune.precisionrace import candidate_precision

    monkeypatch.setenv(HIDE_ENV, machine[HIDE_ENV])
    precision.bf16_availability.cache_clear()
    try:
        candidate, why = candidate_precision()
        resolved = resolve(AccelSpec())
    finally:
        precision.bf16_availability.cache_clear()
    assert candidate is None and "no fast 16-bit precision here" in why and "no hardware support" in why
    assert resolved.precision == "fp32"


def test_a_bad_spec_is_refused_before_any_probe(machine, tmp_path):
    """`ortlab train` with data that does not exist: refused with ortlab's own words, and nothing probed on the way
    (the foreground launcher checks the mix against this process; the data comes before any model)."""
    started = time.monotonic()
    out = subprocess.run(
        [ORTLAB, "train", "--data", str(tmp_path / "missing.csv"), "--output-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **machine, "COLUMNS": "80"},
    )
    took = time.monotonic() - started
    assert out.returncode != 0
    assert "missing.csv" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "probing" not in out.stderr, "a refused spec waited for the doctor"
    print(f"refused in {took:.1f} s")
