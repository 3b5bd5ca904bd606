"""What a user reads in an 80-column terminal: `ortlab train` shows ortlab's lines, one progress bar and the
result (third-party output goes to the run's logs/run.log; `--verbose` brings it back), and `ortlab runs` /
`ortlab compare` cut no cell short."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON

ORTLAB = str(Path(PYTHON).parent / "ortlab")

# What torch, transformers, DeepSpeed, onnxruntime and tqdm print during a run when nobody stops them.
NOISE = (
    "LOAD REPORT",
    "Setting accelerator",
    "No CUDA runtime",
    "cudart",
    "Warning",
    "{'loss'",
    "{'train_runtime'",
    "it/s]",
    "Traceback",
)


def ortlab(*args: str, columns: int = 80, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS=str(columns))
    return subprocess.run([ORTLAB, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert) -> dict:
    """Two real tiny runs in one runs folder: one as a user starts it, one with --verbose (and without ORT)."""
    root = tmp_path_factory.mktemp("runs")
    common = ["--model", str(tiny_bert), "--max-train-samples", "64", "--max-eval-samples", "32"]
    common += ["--max-steps", "4", "--batch-size", "8", "--max-length", "32", "--output-dir", str(root)]
    out: dict = {"root": root}
    for key, extra in (("plain", ["--ort"]), ("verbose", ["--no-ort", "--verbose"])):
        proc = ortlab("train", *common, *extra)  # default run names: as long as a user gets them
        assert proc.returncode == 0, proc.stderr[-3000:]
        (path,) = [line[4:] for line in proc.stdout.splitlines() if line.startswith(f"run {root}")]
        out[key], out[f"{key}_id"] = proc, Path(path).name
    return out


@pytest.mark.slow
def test_train_shows_ortlab_lines_and_logs_the_rest(trained):
    proc, run_dir = trained["plain"], trained["root"] / trained["plain_id"]
    screen = proc.stdout + proc.stderr
    for noise in NOISE:
        assert noise not in screen, f"{noise!r} reached the terminal:\n{screen}"
    for said in (
        "new sequence classification head for 2 labels",
        "evaluating on 32 rows before training",
        "before training: accuracy",
        "ONNX Runtime is building the training graph (once per model shape)",
        "after training:  accuracy",
        "accelerations applied: ort",
    ):
        assert said in screen, f"{said!r} is missing:\n{screen}"
    lines = proc.stdout.splitlines()
    assert f"run {run_dir}" in lines, "the run's path is printed whole, on its own line"
    bars = [line for line in lines if line.startswith("training ") and "4/4" in line]
    assert len(bars) == 1 and "loss" in bars[0] and "samples/s" in bars[0], lines
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    # Nothing was thrown away: the run's log has the third-party output, and ortlab's lines for context.
    log = (run_dir / "logs" / "run.log").read_text()
    assert "LOAD REPORT" in log and "{'train_runtime'" in log
    assert "[ortlab] before training: accuracy" in log


@pytest.mark.slow
def test_verbose_brings_the_libraries_output_back(trained):
    screen = trained["verbose"].stdout + trained["verbose"].stderr
    assert "{'train_runtime'" in screen
    assert "LOAD REPORT" in screen
    assert "before training: accuracy" in screen


@pytest.mark.slow
@pytest.mark.parametrize("command", ["runs", "compare"])
def test_tables_are_readable_at_80_columns(trained, command):
    ids = [trained["plain_id"], trained["verbose_id"]]
    args = ["--root", str(trained["root"])] + ([*ids, "--baseline", ids[1]] if command == "compare" else [])
    proc = ortlab(command, *args, columns=80)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout, proc.stdout
    assert all(len(line) <= 80 for line in lines), proc.stdout
    for run_id in ids:
        assert any(run_id in line.split() for line in lines), f"{run_id} is not shown whole:\n{proc.stdout}"
    for fact in ("completed", "fused_adam", "samples/s", "accuracy"):
        assert fact in proc.stdout, proc.stdout
    if command == "compare":
        assert "(baseline)" in next(line for line in lines if ids[1] in line.split())


@pytest.mark.slow
def test_a_wide_terminal_gets_one_table_row_per_run(trained):
    ids = [trained["plain_id"], trained["verbose_id"]]
    proc = ortlab("compare", "--root", str(trained["root"]), *ids, columns=200)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.split()[:1] in ([ids[0]], [ids[1]])]
    assert len(rows) == 2 and all("completed" in row and "accuracy" in row for row in rows), proc.stdout


def test_captured_output_takes_every_kind_of_output_to_the_log(tmp_path, capfd):
    import logging
    import sys

    from ortlab.train.terminal import captured_output

    log = tmp_path / "logs" / "run.log"
    with captured_output(log):
        print("from print")
        os.write(1, b"from the C level\n")
        sys.stderr.write("a library warning\n")  # what warnings.showwarning does (pytest records real ones)
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from a child process\\n')"], check=True)
        late = logging.getLogger("ortlab-test-late-library")
        late.addHandler(logging.StreamHandler())  # a library configuring its logger inside the block
        late.warning("logged inside")
    screen = capfd.readouterr()
    assert screen.out == "" and screen.err == "", screen
    text = log.read_text()
    for said in ("from print", "from the C level", "a library warning", "from a child process", "logged inside"):
        assert said in text, text
    late.warning("logged after the block")  # goes to the screen again, not to a closed file
    assert "logged after the block" in capfd.readouterr().err
