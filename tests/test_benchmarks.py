"""Every benchmark still imports and starts: a moved name must fail here, not months later in someone's run.

Why this exists: `benchmarks/bench_trainer.py` imported two names (inside the row process's function) that had moved
to `ortlab/train/control.py`, and every ortlab row of it failed for weeks: importing the file did not notice, since
the imports sat in a function. So this module checks, for every `benchmarks/*.py` with an entry point:
- every `from ortlab... import name` and `from <sibling benchmark or test helper> import name` in the file, module
  level or inside a function, still resolves (the module imports and has the name);
- the file runs as a script with `--help` in a fresh process where Ray cannot be imported (argument parsing needs
  neither Ray nor a GPU, and a benchmark that imports Ray at its top would fail here);
- bench_trainer's `--smoke` mode runs end to end (its rows, ratios and share of the measured peak).
The smoke modes of bench_gpu, bench_lora, bench_live_view, bench_allocator, bench_dpo_trl and bench_onnx_kv run in
their own test modules (COVERED_ELSEWHERE).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
HELPERS = ROOT / "tests" / "helpers"
# Benchmarks whose smallest mode another test module runs: not run again here (their names are still checked).
COVERED_ELSEWHERE = {
    "bench_allocator": "test_tcmalloc.py",
    "bench_dpo_trl": "test_bench_dpo_trl.py",
    "bench_gpu": "test_bench_gpu.py",
    "bench_lora": "test_bench_lora.py",
    "bench_live_view": "test_bench_live_view.py",
    "bench_onnx_kv": "test_export_kvcache.py",
}


def entry_points() -> list[str]:
    """The benchmarks a user runs: files with a `__main__` block (common.py is a library of theirs)."""
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def unresolved_imports(path: Path) -> list[str]:
    """`from X import name` statements anywhere in `path` (functions included) whose name X no longer has, for X
    in ortlab or a sibling benchmark or test helper; each as 'line N: from X import name (why)'."""
    local = {p.stem for folder in (BENCHMARKS, HELPERS) for p in folder.glob("*.py")}
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names if a.name.split(".")[0] == "ortlab"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            targets = [(node.module, a.name) for a in node.names] if top == "ortlab" or top in local else []
        else:
            continue
        for module_name, name in targets:
            where = f"line {node.lineno}: " + (f"from {module_name} import {name}" if name else f"import {module_name}")
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                problems.append(f"{where} ({e})")
                continue
            if name is None or name == "*" or hasattr(module, name):
                continue
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ImportError:
                problems.append(f"{where} ({module_name} has no {name!r})")
    return problems


@pytest.fixture
def benchmark_path(monkeypatch):
    """Sibling benchmarks and test helpers importable as the scripts see them; sys.path and the benchmarks'
    modules put back afterwards (`common` is too generic a name to leave in sys.modules)."""
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), str(HELPERS), *sys.path])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


def test_every_benchmark_is_found():
    found = entry_points()
    assert {"bench_trainer", "bench_gpu", "bench_raytrain", "ort_cpu_study"} <= set(found)
    assert "common" not in found
    for bench, test_file in COVERED_ELSEWHERE.items():
        assert bench in found
        assert f"{bench}.py" in (ROOT / "tests" / test_file).read_text(), f"{test_file} no longer runs {bench}"


@pytest.mark.parametrize("bench", entry_points())
def test_imports_and_names_resolve(bench, benchmark_path):
    path = BENCHMARKS / f"{bench}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{bench}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module-level imports
    assert callable(module.main)
    assert unresolved_imports(path) == []


def test_a_moved_name_inside_a_function_is_caught(tmp_path, benchmark_path):
    # The bug this module was written for, planted: names imported from where they no longer are, in a function.
    planted = tmp_path / "bench_planted.py"
    planted.write_text(
        "def child():\n"
        "    from ortlab.train.run import _stop_callback, _StopRequested\n"
        "    from ortlab.train.control import StopRequested\n"
        "    from common import interleave, no_such_helper\n"
        "    import ortlab.no_such_module\n"
    )
    problems = unresolved_imports(planted)
    assert len(problems) == 4, problems
    assert problems[0].startswith("line 2: from ortlab.train.run import _stop_callback")
    assert "no_such_helper" in problems[2] and "ortlab.no_such_module" in problems[3]


# Runs the script with Ray made unimportable: `import ray` raises ImportError in that process.
WITHOUT_RAY = "import runpy, sys; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"  # noqa: E501


@pytest.mark.parametrize("bench", [b for b in entry_points() if b != "bench_trainer"])
def test_argument_parsing_without_ray(bench):
    path = BENCHMARKS / f"{bench}.py"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, str(path), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout and "--" in done.stdout


@pytest.mark.slow  # three training processes that import torch: 50-90 s on a busy 2-core machine
def test_bench_trainer_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, str(BENCHMARKS / "bench_trainer.py"), "--smoke", "--output", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["tuned"] is None
    rows = {r["mix"]: r for r in report["results"]}
    default = next(name for name in rows if name.startswith("default"))
    assert set(rows) == {"baseline", "baseline_bf16", default}, "smoke: the two plain Trainers and ortlab's default"
    for name, r in rows.items():
        assert "error" not in r, (name, r.get("error"))
        assert len(r["slices"]) == report["rounds"] == 2 and r["samples_per_s"] > 0
    base, bf16 = rows["baseline"], rows["baseline_bf16"]
    assert base["throughput_ratio"] == 1.0 and bf16["ratio_to_bf16_trainer"] == 1.0
    # ortlab's row went through ORTTrainer with the run folder's stop callback (the path that had broken).
    assert rows[default]["applied"] and all(rows[default]["applied"].values())
    paired = sorted(x / y for x, y in zip(rows[default]["slices"], bf16["slices"], strict=True))
    assert rows[default]["ratio_to_bf16_trainer"] == pytest.approx(sum(paired) / 2)  # median of two rounds
    lo, hi = rows[default]["ratio_to_bf16_trainer_ci95"]
    assert lo <= rows[default]["ratio_to_bf16_trainer"] <= hi
    # all-MiniLM-L6-v2's FLOPs: 6 layers of 384 wide; N = 6 x (attention 4(384^2+384) + FFN 2(384x1536)+1536+384
    # + two LayerNorms 4x384) + embeddings' LayerNorm 768 + pooler 384^2+384 + classifier 384x2+2.
    n = 6 * (4 * (384**2 + 384) + 2 * 384 * 1536 + 1536 + 384 + 4 * 384) + 768 + (384**2 + 384) + (384 * 2 + 2)
    assert report["model_shape"]["matmul_params"] == n
    seq = report["seq_len"]
    assert report["flops_per_sample"] == 6 * n * seq + 12 * 6 * 384 * seq**2
    # The share of the peak is taken against the measured peak of the precision the row's matmuls use.
    assert base["matmul_precision"] == rows[default]["matmul_precision"] == "fp32"
    assert bf16["matmul_precision"] == "bf16"
    for r in rows.values():
        peak = report["measured_peak"][r["matmul_precision"]]
        assert peak["flops"] > 0 and peak["threads"] >= 1
        assert r["peak_pct"] == pytest.approx(100 * r["samples_per_s"] * report["flops_per_sample"] / peak["flops"])
        assert 0 < r["peak_pct"] < 100


@pytest.mark.slow  # two `ortlab train` processes of the demo for 4 steps: 30-60 s on a busy 2-core machine
def test_bench_precision_smoke(tmp_path):
    out = tmp_path / "precision.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_precision.py"), "--smoke", "--seeds", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] is True and [r["precision"] for r in report["runs"]] == ["fp32", "bf16"]
    fp32, bf16 = report["runs"]
    assert bf16["bf16_applied"] and not fp32["bf16_applied"], "each run trained in the precision it was given"
    assert fp32["peak"]["source"] == bf16["peak"]["source"] == "measured"
    assert (fp32["peak"]["precision"], bf16["peak"]["precision"]) == ("fp32", "bf16")
    (pair,) = report["pairs"]
    assert pair["curve_steps"] == 4 and pair["curve_within_tolerance"], pair
    assert pair["accuracy_diff"] == pytest.approx(bf16["eval_accuracy"] - fp32["eval_accuracy"])
