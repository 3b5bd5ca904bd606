"""ortlab's compile runtime: built for real, probed by the doctor, and a torch_compile run trained there by itself.

The slow tests build the runtime once per test session (about 15 s with uv's cache warm) under a test-local
folder, `.cache/test-runtimes` in the checkout, and reuse it across sessions while its stamp still matches this
tree and lock (a stale one is rebuilt by `create` itself). The fast tests never build: they use an empty folder,
or a fake runtime whose stamp is right but whose interpreter is this one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

from ortlab import runtimes
from ortlab.runner import RunError

ORTLAB = str(Path(PYTHON).parent / "ortlab")
TEST_RUNTIMES = ROOT / ".cache" / "test-runtimes"


def _this_runtime_compiles() -> bool:
    from ortlab.accel import torch_compile

    return torch_compile.availability().available


needs_ort_runtime = pytest.mark.skipif(
    _this_runtime_compiles(), reason="this runtime can compile by itself: nothing goes to the compile runtime"
)


@pytest.fixture
def no_runtimes(tmp_path, monkeypatch) -> Path:
    where = tmp_path / "runtimes"
    monkeypatch.setenv("ORTLAB_RUNTIMES_DIR", str(where))
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    return where


def _fake_ready_runtime(root: Path) -> Path:
    """A folder that passes for a built compile runtime (right stamp), whose interpreter is this one."""
    path = root / "compile"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / runtimes.STAMP).write_text(json.dumps({"fingerprint": runtimes._fingerprint("compile"), "torch": "x"}))
    return path / "bin" / "python"


# --- fast: what counts as built, and the errors without a runtime ---------------------------------------------------


def test_python_for_accepts_only_a_complete_build_for_this_tree(no_runtimes):
    assert runtimes.python_for("compile") is None, "nothing built yet"
    python = _fake_ready_runtime(no_runtimes)
    assert runtimes.python_for("compile") == python
    stamp = python.parent.parent / runtimes.STAMP
    stamp.write_text(json.dumps({"fingerprint": "from-another-lock"}))
    assert runtimes.python_for("compile") is None, "a runtime built from another lock is not used"
    assert "another ortlab or requirements/dev.lock" in runtimes.state_of("compile").why
    stamp.unlink()
    assert runtimes.python_for("compile") is None, "a build without its stamp is half-built"
    assert "not built completely" in runtimes.state_of("compile").why
    with pytest.raises(ValueError, match="unknown runtime"):
        runtimes.python_for("nope")


@needs_ort_runtime
def test_without_a_compile_runtime_the_error_names_the_command(no_runtimes, tmp_path):
    import ortlab
    from ortlab.runner import RunError
    from ortlab.spec import RunSpec

    RunSpec.parse({"accel": {"torch_compile": True}})  # a description: the launch judges where it can run
    with pytest.raises(RunError, match="ortlab runtime create compile"):
        ortlab.launch({"output_dir": str(tmp_path / "runs"), "accel": {"torch_compile": True}})
    assert not (tmp_path / "runs").exists(), "refused before a run folder exists"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [ORTLAB, "train", "--torch-compile", "--max-steps", "1", "--output-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "ortlab runtime create compile" in out.stderr
    assert "Traceback" not in out.stderr


@needs_ort_runtime
def test_ort_with_torch_compile_stays_refused_with_a_compile_runtime(no_runtimes):
    from ortlab.spec import RunSpec, SpecError

    _fake_ready_runtime(no_runtimes)
    RunSpec.parse({"accel": {"torch_compile": True}})  # accepted: a launched run goes to the compile runtime
    with pytest.raises(SpecError, match="pick one"):
        RunSpec.parse({"accel": {"ort": True, "torch_compile": True}})


@needs_ort_runtime
def test_in_process_compile_points_to_the_compile_runtime(no_runtimes):
    from ortlab import MixError, ORTTrainingArguments

    python = _fake_ready_runtime(no_runtimes)
    with pytest.raises(MixError) as info:
        ORTTrainingArguments(output_dir="unused", report_to=[], use_ort=False, torch_compile=True)
    assert "cannot run in this process" in str(info.value)
    assert str(python) in str(info.value), "the way out: the compile runtime's Python"


def test_a_failed_build_names_the_step_and_leaves_nothing(no_runtimes, monkeypatch):
    monkeypatch.setenv("ORTLAB_RUNTIME_TORCH", "torch==0.0.1")  # no such torch anywhere
    lines: list[str] = []
    with pytest.raises(runtimes.RuntimeCreateError, match="step 'packages' failed") as info:
        runtimes.create("compile", progress=lines.append)
    assert "torch==0.0.1" in str(info.value)
    assert any(line.startswith("[1/5]") for line in lines), "progress was shown"
    assert not (no_runtimes / "compile").exists(), "nothing half-built stays behind"
    assert runtimes.python_for("compile") is None


# --- slow: the real runtime ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def compile_runtime(tmp_path_factory) -> Path:
    """The real compile runtime under the test-local folder (built once, reused while its stamp matches)."""
    saved = {k: os.environ.get(k) for k in ("ORTLAB_RUNTIMES_DIR", "ORTLAB_CACHE_DIR")}
    os.environ["ORTLAB_RUNTIMES_DIR"] = str(TEST_RUNTIMES)
    os.environ["ORTLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("ortlab-cache"))  # real probes, not a user's cache
    try:
        yield runtimes.create("compile", progress=lambda line: print(line, flush=True))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.slow
def test_the_runtime_has_a_new_torch_and_no_ort(compile_runtime):
    stamp = json.loads((compile_runtime.parent.parent / runtimes.STAMP).read_text())
    major, minor = (int(x) for x in stamp["torch"].split(".")[:2])
    assert (major, minor) >= (2, 7), stamp
    code = (
        "import importlib.util as u, json, ortlab, transformers; print(json.dumps([u.find_spec('onnxruntime') is None,"
        " ortlab.__file__, transformers.__version__]))"
    )
    out = subprocess.run([str(compile_runtime), "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    no_ort, ortlab_file, transformers_version = json.loads(out.stdout.strip().splitlines()[-1])
    assert no_ort, "no onnxruntime in the compile runtime"
    assert Path(ortlab_file).resolve().is_relative_to(ROOT), "ortlab from this source tree"
    from importlib.metadata import version

    assert transformers_version == version("transformers"), "the same transformers as the ORT runtime (the lock's)"
    again: list[str] = []
    assert runtimes.create("compile", progress=again.append) == compile_runtime
    assert again == [f"the compile runtime is ready: {compile_runtime}"], "idempotent: a second create does nothing"


@pytest.mark.slow
def test_the_doctor_shows_the_compile_runtime(compile_runtime):
    out = subprocess.run([ORTLAB, "doctor", "--json"], capture_output=True, text=True, timeout=300, env={**os.environ})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rt = report["runtimes"]["compile"]
    assert rt["ready"] and rt["python"] == str(compile_runtime)
    assert rt["torch"] and not rt["torch"].startswith("2.6")
    details = rt["torch_compile"]["details"]
    assert rt["torch_compile"]["available"] and details["inductor"] is True, rt
    assert details["compiler"], "the C++ compiler Inductor uses on CPU"
    tc = report["accelerations"]["torch_compile"]
    if not _this_runtime_compiles():
        assert tc["available"] and "available in the compile runtime" in tc["reason"], tc


def _separable_csv(path: Path) -> Path:
    """Sentences whose label is one word in them: a tiny model learns it within tens of steps."""
    import random

    rng = random.Random(0)
    nouns = ["movie", "film", "story", "plot", "cast", "ending", "script", "score"]
    fillers = ["the", "this", "that", "a", "really", "quite", "very", "so", "truly", "was", "is"]
    lines = ["text,label"]
    for i in range(600):
        good = i % 2 == 0
        words = [rng.choice(fillers) for _ in range(6)] + [rng.choice(nouns), "good" if good else "bad"]
        rng.shuffle(words)
        lines.append(f"{' '.join(words)},{'pos' if good else 'neg'}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
@needs_ort_runtime
def test_a_torch_compile_run_trains_compiled_in_the_compile_runtime(compile_runtime, tiny_bert, tmp_path):
    import ortlab

    spec = {
        "name": "compiled",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": str(tiny_bert)},
        "data": {"source": str(_separable_csv(tmp_path / "data.csv")), "max_eval_samples": 64},
        "hyper": {"learning_rate": 2e-3, "batch_size": 16, "max_length": 16, "max_steps": 40, "logging_steps": 5},
        "accel": {"torch_compile": True, "fused_adam": False},  # ort 'auto' yields to an explicit compile
    }
    run = ortlab.launch(spec)
    status = run.wait(timeout=600)
    log = run.dir.log_path.read_text() if run.dir.log_path.exists() else ""
    assert status["state"] == "completed", f"{status}\n{log[-3000:]}"
    assert status["runtime"] == "compile", "the run folder records which runtime ran it"
    assert status["python"] == str(compile_runtime), "the worker itself ran in the compile runtime"

    losses = [r["loss"] for r in run.metrics() if r["event"] == "step"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses), losses
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first * 0.8, f"the loss did not go down: first 10 {first:.3f}, last 10 {last:.3f}"

    result = run.result()
    compiled = result["accelerations"]["torch_compile"]
    assert compiled["requested"] and compiled["applied"], compiled
    d = compiled["details"]
    assert d["module"] == "OptimizedModule" and d["frames_compiled"] > 0 and d["graphs"] > 0, d
    assert not d["torch"].startswith("2.6"), d
    assert not result["accelerations"]["ort"]["requested"], "ORT does not stack with torch.compile"
    verified = [r for r in run.metrics() if r["event"] == "verified"]
    assert verified and verified[0]["accelerations"]["torch_compile"]["applied"], "known from the first step on"


def test_resume_without_the_runtime_says_how_to_build_it(no_runtimes, tmp_path):
    """A stopped torch_compile run whose runtime was removed since: resume refuses with the command, starts nothing."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run
    from ortlab.spec import RunSpec

    if _this_runtime_compiles():
        pytest.skip("this runtime can compile by itself")
    _fake_ready_runtime(no_runtimes)
    spec = RunSpec.parse({"name": "gone", "output_dir": str(tmp_path / "runs"), "accel": {"torch_compile": True}})
    run_dir = RunDir.create(spec.output_dir, spec)
    run_dir.set_status("stopped", step=3)
    (run_dir.checkpoints / "checkpoint-3").mkdir(parents=True)
    (run_dir.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    shutil.rmtree(no_runtimes / "compile")
    with pytest.raises((RunError, ValueError), match="ortlab runtime create compile"):
        Run(run_dir.path).resume()
    assert Run(run_dir.path).state == "stopped", "nothing was claimed or started"
