"""tcmalloc as the allocator of the processes that train (`ortlab.accel.tcmalloc`): found only where distributions
install it, preloaded by whoever starts the process (the local launcher, the tuner, `ortlab train` starting itself
again), verified inside the process, and training exactly what glibc's malloc trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON

from ortlab.accel import tcmalloc
from ortlab.accel.mix import Mix, problems, resolve
from ortlab.envvars import ortlab_path
from ortlab.spec import AccelSpec, RunSpec

INSTALLED = tcmalloc.find() is not None
# CI's machine is set up by `scripts/dev setup`, which installs the library: there, these tests run, and fail if it
# did not. Elsewhere a machine without it skips them, saying how to get it.
needs_library = pytest.mark.skipif(
    not INSTALLED and not os.environ.get("CI"),
    reason=f"{tcmalloc.LIBRARY} is not installed here: {tcmalloc.REMEDY}",
)


def test_process_env_puts_the_library_first_keeps_other_preloads_and_takes_it_out_when_off(monkeypatch, tmp_path):
    lib = tmp_path / tcmalloc.LIBRARY
    monkeypatch.setattr(tcmalloc, "find", lambda: lib)
    theirs = {"LD_PRELOAD": "/opt/libmine.so /usr/lib/libtcmalloc.so.4", "PATH": "/bin"}

    on = tcmalloc.process_env(theirs, on=True)
    assert on["LD_PRELOAD"] == f"{lib} /opt/libmine.so", "one tcmalloc, first; the user's own preload kept"
    assert on["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == str(2**40), "its 'large alloc' lines stay out of sight"
    assert on["PATH"] == "/bin" and theirs["LD_PRELOAD"].startswith("/opt"), "the given env is not changed"
    mine = tcmalloc.process_env({"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "1024"}, on=True)
    assert mine["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == "1024", "a threshold the user set is theirs"

    off = tcmalloc.process_env(theirs, on=False)
    assert off["LD_PRELOAD"] == "/opt/libmine.so", "a run that asked for glibc's malloc gets no tcmalloc at all"
    assert "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" not in off
    assert "LD_PRELOAD" not in tcmalloc.process_env({"LD_PRELOAD": str(lib)}, on=False)

    monkeypatch.setattr(tcmalloc, "find", lambda: None)
    assert tcmalloc.process_env(theirs, on=True)["LD_PRELOAD"] == "/opt/libmine.so", "not installed: nothing added"


def test_the_library_is_looked_for_only_where_distributions_install_it(monkeypatch, tmp_path):
    system, prefix, elsewhere = tmp_path / "usr-lib", tmp_path / "env", tmp_path / "elsewhere"
    for folder in (system, prefix / "lib", elsewhere):
        folder.mkdir(parents=True)
    monkeypatch.setattr(tcmalloc, "SEARCH_DIRS", (str(system),))
    monkeypatch.setattr(sys, "prefix", str(prefix))
    (elsewhere / tcmalloc.LIBRARY).write_bytes(b"\x7fELF")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(elsewhere))  # a variable is not a place it is looked for
    assert tcmalloc.find() is None

    (prefix / "lib" / tcmalloc.LIBRARY).write_bytes(b"\x7fELF")  # conda's gperftools
    assert tcmalloc.find() == prefix / "lib" / tcmalloc.LIBRARY
    (system / tcmalloc.LIBRARY).write_bytes(b"\x7fELF")
    assert tcmalloc.find() == system / tcmalloc.LIBRARY, "the system's copy first"


def test_the_doctor_row_without_the_library_names_the_package(monkeypatch):
    monkeypatch.setattr(tcmalloc, "find", lambda: None)
    row = tcmalloc.availability.__wrapped__()
    assert row.available is False
    assert tcmalloc.LIBRARY in row.reason and "not installed" in row.reason
    assert "apt-get install libtcmalloc-minimal4" in row.remedy and "gperftools" in row.remedy


def test_auto_means_what_this_process_started_with(monkeypatch):
    monkeypatch.setattr(tcmalloc, "loaded", lambda: Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"))
    assert resolve(AccelSpec()).tcmalloc is True
    assert resolve(AccelSpec(tcmalloc=False)).tcmalloc is False, "an explicit false is never changed"
    monkeypatch.setattr(tcmalloc, "loaded", lambda: None)
    assert resolve(AccelSpec()).tcmalloc is False, "a process without it (a Jupyter kernel) trains without it"
    assert RunSpec().accel.tcmalloc == "auto"
    assert RunSpec.model_validate({"accel": {"tcmalloc": True}}).asked_mix().tcmalloc is True


def test_asking_for_it_in_a_process_that_started_without_it_is_refused_with_the_fix():
    assert tcmalloc.loaded() is None, "this test process was started with glibc's malloc"
    errors, _ = problems(Mix(tcmalloc=True))
    assert len(errors) == 1, errors
    assert "did not start with it" in errors[0] and "ortlab.launch(spec)" in errors[0] and "'auto'" in errors[0]
    assert problems(Mix(tcmalloc=False)) == ([], [])


def test_the_local_launcher_preloads_it_as_the_spec_and_the_doctor_say(monkeypatch, tmp_path):
    from ortlab.accel import Availability
    from ortlab.runner import local

    lib = tmp_path / tcmalloc.LIBRARY
    monkeypatch.setattr(tcmalloc, "find", lambda: lib)
    monkeypatch.delenv("LD_PRELOAD", raising=False)

    class Doctor:
        def __init__(self, available: bool):
            self.accelerations = {"tcmalloc": Availability("tcmalloc", available, "r", "fix")}

    def env_for(setting, available: bool | None) -> dict[str, str]:
        report = None if available is None else Doctor(available)
        monkeypatch.setattr(local, "cached_report", lambda python=None: report)
        spec = RunSpec.model_validate({"accel": {"tcmalloc": setting}})
        return local.allocator_env(spec, sys.executable)

    assert env_for("auto", True)["LD_PRELOAD"] == str(lib)
    assert "LD_PRELOAD" not in env_for("auto", False), "the interpreter's doctor found it not working"
    assert "LD_PRELOAD" not in env_for("auto", None), "no doctor's report to go by: glibc's (never a probe here)"
    assert env_for(True, True)["LD_PRELOAD"] == str(lib)
    monkeypatch.setenv("LD_PRELOAD", str(lib))  # e.g. the Jupyter server was started with it
    assert "LD_PRELOAD" not in env_for(False, True), "false means glibc's, whatever started the launcher"


@needs_library
def test_a_process_started_with_it_has_it_and_torch_lives_with_it():
    code = "from ortlab.accel.tcmalloc import loaded; print(loaded())"
    base = {**os.environ, "PYTHONPATH": ortlab_path()}
    on = subprocess.run([PYTHON, "-c", code], env=tcmalloc.process_env(base, on=True), capture_output=True, text=True)
    off = subprocess.run([PYTHON, "-c", code], env=tcmalloc.process_env(base, on=False), capture_output=True, text=True)
    assert Path(on.stdout.strip()) == tcmalloc.find().resolve(), on.stderr  # (the file the link names)
    assert off.stdout.strip() == "None", off.stderr
    row = tcmalloc.availability.__wrapped__(probe=True)  # a Python started with it imports torch and multiplies
    assert row.available, row.reason
    assert "probed: torch ran with it" in row.reason


@needs_library
@pytest.mark.slow
def test_ortlab_train_starts_itself_again_with_it_and_trains_exactly_the_same(tmp_path):
    """The demo as a user runs it (`ortlab train`, the console script, in the foreground), with --tcmalloc and with
    --no-tcmalloc: through the allocator benchmark's smoke mode, which is the same two commands."""
    out = tmp_path / "allocator.json"
    done = subprocess.run(
        [PYTHON, str(Path(__file__).parents[1] / "benchmarks" / "bench_allocator.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = {r["arm"]: r for r in report["runs"]}
    assert runs["tcmalloc"]["tcmalloc_applied"] is True, "the command started itself again with the library"
    assert Path(runs["tcmalloc"]["library"]) == tcmalloc.find().resolve()
    assert runs["glibc"]["tcmalloc_applied"] is False and runs["glibc"]["library"] is None
    assert len(runs["tcmalloc"]["losses"]) == len(runs["glibc"]["losses"]) == 4
    (pair,) = report["pairs"]
    assert pair["same_losses"] and pair["max_loss_gap"] == 0.0, "an allocator never changes what is computed"
    assert pair["same_eval"] and report["same_training"] is True
    assert pair["samples_per_s_ratio"] > 0 and pair["peak_mem_ratio"] > 0
    assert "median:" in done.stdout


def test_a_ray_run_that_asks_for_it_is_refused_before_it_starts(monkeypatch, tmp_path):
    """A Ray worker is started by Ray's own processes: ortlab cannot choose its allocator, so an explicit `true` is
    refused at the check, with the fix; 'auto' trains there with glibc's malloc (the workers' record says so)."""
    from ortlab.probe import doctor
    from ortlab.runner import rayjob
    from ortlab.runner.launcher import RunError

    report = doctor().to_dict()  # (this machine's, cached): stands in for the cluster's doctor job
    monkeypatch.setattr(rayjob, "cluster_doctor", lambda spec: {**report, "resources": {"CPU": 8.0}, "storage": "ok"})
    monkeypatch.setattr(rayjob, "probe_storage", lambda storage: None)
    target = {"cluster": "http://127.0.0.1:8265", "storage": str(tmp_path / "shared")}
    spec = {"output_dir": str(tmp_path / "runs"), "target": target}
    with pytest.raises(RunError, match=r"accel.tcmalloc: not on a Ray cluster yet .* set it to 'auto'"):
        rayjob.RayJob().preflight(RunSpec.model_validate({**spec, "accel": {"tcmalloc": True}}))
    rayjob.RayJob().preflight(RunSpec.model_validate(spec))  # 'auto': no refusal
