"""MFU over 100 % is flagged wherever MFU is shown: the run summary, compare, the charts' MFU panel, the model card.

A run cannot use more than the machine's peak; an MFU of 220 % says the cached peak (`ortlab.peak`) was measured
while other work ran. Each face says so, with the remedy (`ortlab doctor --refresh` on a quiet machine), instead of
printing the number bare; a run under 100 % shows its number alone.
"""

from __future__ import annotations

import pytest
from fake_runs import append, make_fake_run, step_record
from rich.console import Console

from ortlab.runfolder.compare import OVER_PEAK, mfu_text, over_peak

REMEDY = "ortlab doctor --refresh"


def _mfu_run(root, name: str, mfu: float):
    """A completed run folder whose steps carry `mfu` (a fraction of the measured peak), with its summary."""
    from ortlab import safeio
    from ortlab.runfolder.compare import summarize
    from ortlab.runfolder.rundir import RunDir

    run = RunDir(make_fake_run(root, name, steps=0))
    steps = [{**step_record(i), "mfu": mfu, "model_tflops_per_s": 0.3} for i in range(1, 8)]
    append(run.metrics_path, *steps)
    safeio.write_json(
        run.path, "result.json", {"summary": summarize([{"event": "train_begin"}, *steps]), "eval_after": {}}
    )
    return run.path


def test_the_text_flags_only_what_is_over_the_peak():
    assert REMEDY in OVER_PEAK and "quiet machine" in OVER_PEAK
    assert mfu_text(0.54) == "54.0%" and mfu_text(1.0) == "100.0%"
    assert mfu_text(2.2) == f"220.0% ({OVER_PEAK})"
    assert over_peak(1.01) and not over_peak(0.99) and not over_peak(None) and not over_peak(True)


@pytest.mark.parametrize("width", [250, 80])  # the wide table and the narrow layout
def test_compare_flags_a_run_over_the_peak_and_says_the_remedy(tmp_path, width):
    from ortlab.runfolder.compare import compare, render
    from ortlab.runner import Run

    fine, over = _mfu_run(tmp_path, "fine", 0.54), _mfu_run(tmp_path, "over", 2.2)
    console = Console(width=width, record=True)
    render(compare([Run(fine), Run(over)]), console)
    text = " ".join(console.export_text().split())
    assert "54.0%" in text and "54.0% (over" not in text
    assert "220.0% (over the measured peak)" in text
    assert f"MFU of over is {OVER_PEAK}" in text
    console = Console(width=width, record=True)
    render(compare([Run(fine)]), console)
    assert REMEDY not in console.export_text()


def test_the_model_card_flags_it(tmp_path):
    from ortlab.publish import model_card
    from ortlab.runner import Run

    card = model_card(Run(_mfu_run(tmp_path, "over", 2.2)))
    assert f"model FLOPs utilisation (MFU): 220.0% ({OVER_PEAK})" in card
    assert REMEDY not in model_card(Run(_mfu_run(tmp_path, "fine", 0.54)))


@pytest.mark.parametrize("mfu", [0.54, 2.2])
def test_the_run_summary_flags_it(capsys, mfu):
    from ortlab.cli.train import _print_result

    summary = {"steady_samples_per_s": 50.0, "steady_tokens_per_s": 6400.0, "warmup_time_s": 1.0}
    summary |= {"peak_mem_mb": 900.0, "steady_mfu": mfu, "steady_model_tflops_per_s": 0.17}
    _print_result(
        {
            "run_dir": "/runs/r1",
            "eval_before": {"eval_accuracy": 0.5},
            "eval_after": {"eval_accuracy": 0.78},
            "summary": summary,
            "accelerations": {"fused_adam": {"requested": True, "applied": True}},
        }
    )
    out = " ".join(capsys.readouterr().out.split())
    if mfu > 1:
        assert f"MFU 220.0%: {OVER_PEAK}" in out
    else:
        assert "MFU 54.0% of this machine's measured matmul peak" in out and REMEDY not in out


def test_the_charts_mfu_panel_says_it_once_a_point_is_over_the_peak(tmp_path):
    from ortlab.ui import RunMonitor
    from ortlab.ui.charts import PANELS

    monitor = RunMonitor(throttle_s=3600)
    title = monitor.figure.layout.annotations[[p for p, _ in PANELS].index("mfu")]
    try:
        monitor.consume("r1", {"event": "step", "step": 1, "loss": 0.5, "mfu": 0.9})
        assert not monitor.over_peak and REMEDY not in title.text
        monitor.consume("r1", {"event": "step", "step": 2, "loss": 0.5, "mfu": 2.2})
        assert monitor.over_peak and REMEDY in title.text and title.text.startswith("MFU (model FLOPs")
        monitor.flush()  # the browser's chart gets the new title with the layout
        assert any(REMEDY in (a.get("text") or "") for a in monitor.chart.figure_layout["annotations"])
    finally:
        monitor.close()


def test_a_history_over_the_peak_flags_the_panel_when_a_chart_opens(tmp_path):
    """Opening a finished run reads its history in one pass (not record by record): the flag must come too."""
    import json

    from ortlab.runner import Run
    from ortlab.ui import RunMonitor

    run_dir = tmp_path / "r2"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "completed"}')
    lines = [{"event": "step", "step": i, "loss": 0.5, "mfu": 2.2 if i == 3 else 0.5} for i in range(1, 6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    monitor = RunMonitor(throttle_s=3600)
    try:
        monitor.add_run(Run(run_dir), follow=False)
        assert monitor.over_peak
        assert any(REMEDY in (a.get("text") or "") for a in monitor.chart.figure_layout["annotations"])
    finally:
        monitor.close()
