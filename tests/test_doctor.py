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
from ortlab.probe import GROUPS
from ortlab.probe import cache as answers
from ortlab.probe.groups import ALL, collect

ORTLAB = str(Path(PYTHON).parent / "ortlab")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A doctor cache of this test module's own: the tests see real probes, not a user's cached answer."""
    return tmp_path_factory.mktemp("ortlab-cache")


@pytest.fixture(scope="module")
def report(cache) -> dict:
    env = dict(os.environ, ORTLAB_CACHE_DIR=str(cache))
    # Cold: this interpreter's groups (90 s at most), its peak (60 s), the compile runtime's groups (90 s).
    out = subprocess.run([ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=300, env=env)
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
    group, result = collect(proc, "ort", time.monotonic() + 30)
    assert group == "ort"
    assert result["outcome"] == "crashed"
    ort = Availability.from_dict(result["accelerations"]["ort"])
    assert not ort.available
    assert "crashed" in ort.reason and "boom" in ort.reason
    assert set(result["accelerations"]) == set(GROUPS["ort"])


def test_ort_rejects_torch_2_7(monkeypatch):
    from ortlab.accel import ort

    real = ort.package_version
    monkeypatch.setattr(ort, "package_version", lambda d: "2.7.1" if d == "torch" else real(d))
    ort.availability.cache_clear()
    try:
        a = ort.availability()
    finally:
        ort.availability.cache_clear()
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
    monkeypatch.setattr(probe, "start_probe", _no_probes)
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
    monkeypatch.setattr(probe, "start_probe", _no_probes)
    with pytest.raises(AssertionError, match="a probe subprocess was started"):
        probe.doctor(refresh=True)


def test_the_fingerprint_follows_versions_and_hardware(monkeypatch):
    base = answers.folder(probe.fingerprint())
    assert base == answers.folder(probe.fingerprint()), "the same environment, the same cache entry"
    real = answers.package_version
    monkeypatch.setattr(answers, "package_version", lambda d: "99.0" if d == "deepspeed" else real(d))
    assert answers.folder(probe.fingerprint()) != base
    monkeypatch.setattr(answers, "package_version", real)
    monkeypatch.setattr(answers, "cpu_facts", lambda: {"model": "another CPU", "flags": "avx512_bf16"})
    assert answers.folder(probe.fingerprint()) != base
    monkeypatch.undo()
    monkeypatch.setattr(answers, "gpu_facts", lambda: ["Model: NVIDIA H100"])
    assert answers.folder(probe.fingerprint()) != base
    monkeypatch.undo()
    # A flag hidden (ORTLAB_HIDE_CPU_FLAGS: the simulated CPU without bf16) is another machine: its own answers.
    monkeypatch.setenv("ORTLAB_HIDE_CPU_FLAGS", "avx2")
    assert answers.folder(probe.fingerprint()) != base


@pytest.fixture
def alone(tmp_path, monkeypatch):
    """An empty doctor cache, and no other ortlab runtime to probe (their doctor is tested above)."""
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ORTLAB_RUNTIMES_DIR", str(tmp_path / "no-runtimes"))
    return tmp_path


def _scripted(outcomes: dict[str, str], started: list[str]):
    """A stand-in for the probe processes (real processes, scripted answers): "ok" answers at once with every
    acceleration of the group available, "crash" aborts, "hang" sleeps past its limit."""

    def fake(python: str, group: str) -> subprocess.Popen:
        started.append(group)
        how = outcomes.get(group, "ok")
        if how == "crash":
            code = "import os; os.abort()"
        elif how == "hang":
            code = "import time; time.sleep(60)"
        else:
            answer = {
                "accelerations": {n: Availability(n, True, f"{n} tried", "-").to_dict() for n in GROUPS.get(group, ())}
            }
            if group == "peak":
                answer = {"peaks": {"device": "cpu", "precisions": {}}}
            code = f"print({probe.groups.MARKER!r} + {json.dumps(json.dumps(answer))})"
        return subprocess.Popen([sys.executable, "-c", code], stdout=-1, stderr=-1, text=True)

    return fake


def test_a_failed_group_is_cached_as_failed_and_costs_the_others_nothing(alone, monkeypatch):
    # Issue #42: a probe that crashed or timed out kept the whole report out of the cache, so every call probed for
    # minutes. Now each group lands in the cache, a failed one as failed, with a back-off before it is tried again.
    monkeypatch.setitem(probe.groups.TIMEOUT_S, "zero1", 2.0)
    started: list[str] = []
    monkeypatch.setattr(probe, "start_probe", _scripted({"ort": "crash", "zero1": "hang"}, started))
    said: list[str] = []
    rep = probe.doctor(progress=said.append)
    assert sorted(started) == sorted(ALL) and not rep.cached
    assert not rep.available("ort") and "crashed" in rep["ort"].reason
    assert not rep.available("zero1") and "did not finish within 2 s" in rep["zero1"].reason
    assert rep.available("fused_adam") and rep.available("tcmalloc"), "the other groups kept their answers"
    assert rep.groups["ort"]["outcome"] == "crashed" and rep.groups["zero1"]["outcome"] == "timed out"
    assert any("the ort probe crashed" in n and "--refresh" in n for n in rep.notes), rep.notes
    assert any("zero1: timed out" in line for line in said), said
    facts = probe.fingerprint()
    assert {p.stem for p in answers.folder(facts).glob("*.json")} == set(ALL), "every group is in the cache"

    # Warm: no probe at all, the failures answered from the cache, not tried again before their back-off.
    started.clear()
    warm = probe.doctor(progress=said.append)
    assert started == [] and warm.cached and "crashed" in warm["ort"].reason
    assert probe.cached_report() is not None

    # Once the back-off has passed, `ortlab doctor` tries the failed groups again (and only those); the launch path
    # (retry=False) never does. A second failure in a row doubles the back-off.
    for group in ("ort", "zero1"):
        a = answers.read(facts, group)
        answers.write(facts, answers.GroupAnswer(**{**a.__dict__, "retry_after": time.time() - 1}))
    assert probe.doctor(retry=False, peak=False).cached and started == []
    again = probe.doctor()
    assert sorted(started) == ["ort", "zero1"] and not again.cached
    second = answers.read(facts, "ort")
    assert second.failures == 2
    assert second.retry_after - second.probed_at == pytest.approx(2 * answers.BACKOFF_S, rel=0.01)
    # --refresh probes every group now.
    started.clear()
    probe.doctor(refresh=True)
    assert sorted(started) == sorted(ALL)


def test_the_launch_path_probes_only_what_was_never_probed_and_never_the_peak(alone, monkeypatch):
    started: list[str] = []
    monkeypatch.setattr(probe, "start_probe", _scripted({}, started))
    rep = probe.doctor(retry=False, peak=False, progress=lambda _line: None)
    assert sorted(started) == sorted(GROUPS) and "peak" not in started
    assert rep.available("ort") and rep.peaks == {}
    assert any("matmul peak is not measured yet" in n for n in rep.notes), rep.notes
    assert probe.cached_report() is not None, "what a launch needs is cached: views answer at once"
    started.clear()
    probe.doctor(retry=False, peak=False)
    assert started == []
    probe.doctor()  # `ortlab doctor`: the peak, which the launch left out, and nothing else
    assert started == ["peak"]


def test_a_launch_probes_another_runtime_only_when_the_run_goes_there(tmp_path, monkeypatch):
    from ortlab import runtimes
    from ortlab.runner.local import launch_doctor

    compile_python = runtimes.python_for("compile")
    if compile_python is None:
        pytest.skip("the compile runtime is not built here (scripts/dev setup builds it)")
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path))
    pythons: list[str] = []
    scripted = _scripted({}, [])
    monkeypatch.setattr(probe, "start_probe", lambda python, group: pythons.append(python) or scripted(python, group))
    report = launch_doctor(sys.executable)
    assert set(pythons) == {sys.executable}, "a run in this runtime: the compile runtime is not probed"
    assert report.runtimes["compile"]["ready"], "still shown, from its stamp"
    pythons.clear()
    launch_doctor(sys.executable, runtimes=True)  # a torch_compile run: where it goes is that runtime's answer
    assert set(pythons) == {str(compile_python)}


def test_two_callers_at_once_probe_an_environment_once(alone, monkeypatch):
    import threading

    started: list[str] = []
    scripted = _scripted({}, started)
    entered, second_waits = threading.Event(), threading.Event()

    def held_start(python: str, group: str) -> subprocess.Popen:
        # The first caller holds the lock here until the second has found it held (however slow the machine); a
        # doctor that took no lock never lets the second wait, and the assertions below fail after 30 s.
        entered.set()
        second_waits.wait(30)
        return scripted(python, group)

    def second_says(line: str) -> None:
        said.append(line)
        if "another process is probing" in line:
            second_waits.set()

    monkeypatch.setattr(probe, "start_probe", held_start)
    said: list[str] = []
    first = threading.Thread(target=lambda: probe.doctor(progress=lambda _line: None))
    first.start()
    assert entered.wait(30)
    second = probe.doctor(progress=second_says)
    first.join(60)
    assert sorted(started) == sorted(ALL), "each group probed once, by the first caller"
    assert any("another process is probing" in line for line in said), said
    assert second.available("ort")


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"fingerprint": {}, "answer": {}}', b"[]", None],
    ids=["not-json", "another-environment", "a-list", "a-row-missing"],
)
def test_a_damaged_answer_is_probed_again_not_trusted(alone, monkeypatch, content):
    started: list[str] = []
    monkeypatch.setattr(probe, "start_probe", _scripted({}, started))
    probe.doctor(progress=lambda _line: None)
    facts = probe.fingerprint()
    path = answers.folder(facts) / "torch.json"
    if content is None:  # this environment's file, its fused_adam row gone
        data = json.loads(path.read_text())
        del data["answer"]["result"]["accelerations"]["fused_adam"]
        content = json.dumps(data).encode()
    path.write_bytes(content)
    started.clear()
    report = probe.doctor(progress=lambda _line: None)
    assert started == ["torch"] and report.available("fused_adam")


def test_an_unwritable_cache_still_answers(alone, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(alone / "file"))
    (alone / "file").write_text("not a folder")
    started: list[str] = []
    monkeypatch.setattr(probe, "start_probe", _scripted({}, started))
    rep = probe.doctor(progress=lambda _line: None)
    assert rep.available("ort") and not rep.cached


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
