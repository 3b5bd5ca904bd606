"""`ortlab doctor`: real probes in real subprocesses, in this environment and in a bare one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

from ortlab import probe
from ortlab.accel import ACCELERATIONS, Availability
from ortlab.probe import GROUPS, _collect

ORTLAB = str(Path(PYTHON).parent / "ortlab")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A doctor cache of this test module's own: the tests see real probes, not a user's cached answer."""
    return tmp_path_factory.mktemp("ortlab-cache")


@pytest.fixture(scope="module")
def report(cache) -> dict:
    env = dict(os.environ, ORTLAB_CACHE_DIR=str(cache))
    out = subprocess.run([ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["cached"] is False, "an empty cache: the probes ran"
    return data


def test_every_acceleration_has_a_reason_and_a_remedy(report):
    accels = report["accelerations"]
    assert list(accels) == list(ACCELERATIONS)
    for name, a in accels.items():
        assert a["name"] == name
        assert isinstance(a["available"], bool)
        assert len(a["reason"]) > 10, a
        assert len(a["remedy"]) > 5, a


def test_dev_environment_runs_ort_fused_adam_and_zero1(report):
    # The pinned development environment exists to make these three work on any machine, CPU included.
    accels = report["accelerations"]
    for name in ("ort", "fused_adam", "zero1"):
        assert accels[name]["available"], accels[name]
    assert "trained through ORTModule" in accels["ort"]["reason"]  # the probe really ran a step


def test_fp16_follows_cuda(report):
    import torch

    fp16 = report["accelerations"]["fp16"]
    assert fp16["available"] == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert "CUDA" in fp16["reason"]
        assert report["devices"] == []


def test_torch_compile_is_refused_on_torch_2_6(report):
    import torch

    if hasattr(torch.compiler, "is_exporting"):
        pytest.skip("this runtime has a torch that can compile")
    from ortlab import runtimes

    tc = report["accelerations"]["torch_compile"]
    if runtimes.python_for("compile") is None:
        assert not tc["available"]
        assert "2.7" in tc["remedy"] or "ortlab runtime create compile" in tc["remedy"]
    else:  # the set-up built the compile runtime: available there, and this runtime says it cannot compile itself
        assert tc["available"] and tc["details"]["runtime"] == "compile"
        assert "this runtime's torch 2.6" in tc["reason"] and "cannot compile" in tc["reason"]


def test_bare_environment_reports_every_acceleration_missing(tmp_path, monkeypatch):
    # A real second runtime without torch: the doctor must explain, not crash.
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    from ortlab.probe import doctor

    rep = doctor(python=str(bare / "bin" / "python"))
    assert rep.torch is None
    for name in ACCELERATIONS:
        a = rep[name]
        assert not a.available, a
        assert "not installed" in a.reason, a
        assert "pip install" in a.remedy, a


def test_a_crashing_probe_is_reported_not_raised():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; sys.stderr.write('boom\\n'); sys.stderr.flush(); os.abort()"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = _collect(proc, "ort", time.monotonic() + 30)
    ort = Availability.from_dict(result["accelerations"]["ort"])
    assert not ort.available
    assert "crashed" in ort.reason and "boom" in ort.reason
    assert set(result["accelerations"]) == set(GROUPS["ort"])


def test_ort_rejects_torch_2_7(monkeypatch):
    from ortlab.accel import ort

    real = ort.package_version
    monkeypatch.setattr(ort, "package_version", lambda d: "2.7.1" if d == "torch" else real(d))
    ort.check.cache_clear()
    try:
        a = ort.check()
    finally:
        ort.check.cache_clear()
    assert not a.available
    assert "torch < 2.7" in a.reason and "torch 2.6.0" in a.remedy


def test_human_table_lists_every_acceleration(report, cache):
    out = subprocess.run(
        [ORTLAB, "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "ORTLAB_CACHE_DIR": str(cache)},
    )
    assert out.returncode == 0, out.stderr
    for name in ACCELERATIONS:
        assert name in out.stdout
    assert "reason" in out.stdout and "remedy" in out.stdout


def _no_probes(python: str, group: str):
    raise AssertionError(f"a probe subprocess was started ({group})")


def test_a_warm_doctor_runs_no_probe(report, cache, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr(probe, "_start", _no_probes)
    warm = probe.doctor()  # the module's first doctor (the `report` fixture) filled the cache
    assert warm.cached
    assert warm.to_dict()["accelerations"] == report["accelerations"]
    assert probe.cached_report() is not None
    # The CLI, in its own process, answers from the same cache.
    env = dict(os.environ, ORTLAB_CACHE_DIR=str(cache))
    out = subprocess.run([ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert json.loads(out.stdout)["cached"] is True


def test_refresh_probes_again(report, cache, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr(probe, "_start", _no_probes)
    with pytest.raises(AssertionError, match="a probe subprocess was started"):
        probe.doctor(refresh=True)


def test_the_fingerprint_follows_versions_and_hardware(monkeypatch):
    base = probe._cache_path(probe.fingerprint())
    assert base == probe._cache_path(probe.fingerprint()), "the same environment, the same cache entry"
    real = probe.package_version
    monkeypatch.setattr(probe, "package_version", lambda d: "99.0" if d == "deepspeed" else real(d))
    assert probe._cache_path(probe.fingerprint()) != base
    monkeypatch.setattr(probe, "package_version", real)
    monkeypatch.setattr(probe, "cpu_facts", lambda: {"model": "another CPU", "flags": "avx512_bf16"})
    assert probe._cache_path(probe.fingerprint()) != base
    monkeypatch.undo()
    monkeypatch.setattr(probe, "_gpu_facts", lambda: ["Model: NVIDIA H100"])
    assert probe._cache_path(probe.fingerprint()) != base


def test_a_probe_that_crashed_is_not_cached(tmp_path, monkeypatch):
    # A crash or a timeout may be a busy machine: the next doctor must probe again, not repeat the failure.
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path))

    def crashing(python: str, group: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import os; os.abort()"], stdout=-1, stderr=-1, text=True)

    monkeypatch.setattr(probe, "_start", crashing)
    rep = probe.doctor()
    assert not rep.cached and not rep.available("ort") and "crashed" in rep["ort"].reason
    assert probe.cached_report() is None
    assert not list(tmp_path.rglob("*.json"))


def test_second_setup_does_nothing():
    out = subprocess.run(
        [sys.executable, "-X", "utf8", str(ROOT / "scripts" / "dev"), "setup"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "installing" not in out.stdout and "building" not in out.stdout, out.stdout
    assert "already built" in out.stdout
