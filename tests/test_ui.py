"""The workbench and the live charts, headless (no browser, no kernel): state, validation, a recorded stream,
throttling, and the static view shown where widgets cannot render."""

from __future__ import annotations

import threading
import time

import pytest

from ortlab.runner import Run
from ortlab.runner.rundir import RunDir
from ortlab.spec import RunSpec

pytest.importorskip("ipywidgets")


@pytest.fixture
def workbench(tmp_path):
    from ortlab.ui import Workbench

    wb = Workbench(spec={"hyper": {"max_steps": 7, "batch_size": 4}, "accel": {"ort": True}}, root=str(tmp_path))
    yield wb
    wb.monitor.close()


def test_widgets_hold_the_spec_and_write_it_back(workbench):
    spec = workbench.spec()
    assert spec.hyper.max_steps == 7
    assert spec.hyper.batch_size == 4
    assert spec.model.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert spec.data.source == "embedded:rotten-tomatoes"
    assert spec.accel.ort is True
    workbench.toggles["ort"].value = False
    workbench.toggles["zero1"].value = True
    workbench.learning_rate.value = 3e-5
    workbench.task.value = "token-classification"
    workbench.data.value = "embedded:synthetic-ner"
    workbench.processes.value = 2
    spec = workbench.spec()
    assert (spec.accel.ort, spec.accel.zero_stage, spec.hyper.learning_rate) == (False, 1, 3e-5)
    assert (spec.task, spec.data.source, spec.target.processes) == ("token-classification", "embedded:synthetic-ner", 2)
    assert RunSpec.from_yaml(spec.to_yaml()) == spec


def test_invalid_spec_disables_launch_and_says_why(workbench):
    assert workbench.launch_button.disabled is False
    workbench.batch_size.value = 0
    assert workbench.launch_button.disabled is True
    assert "hyper.batch_size" in workbench.problems.value
    workbench.batch_size.value = 8
    assert workbench.launch_button.disabled is False
    workbench.learning_rate.value = -1.0
    assert workbench.launch_button.disabled is True
    assert "hyper.learning_rate" in workbench.problems.value


def test_toggles_show_what_the_doctor_says(workbench):
    import torch

    fp16 = workbench.toggles["fp16"]
    assert fp16.disabled == (not torch.cuda.is_available())
    if not torch.cuda.is_available():
        row = next(r for r in workbench.children[0].children if getattr(r, "children", None) and fp16 in r.children)
        assert "fp16 needs a CUDA device" in row.children[1].value
    assert workbench.toggles["ort"].disabled is False  # available in the development environment


def recorded_run(tmp_path, steps: int = 200) -> Run:
    """A run folder holding a recorded metrics stream (as a finished ORT + fused Adam run writes it)."""
    run = RunDir.create(tmp_path / "recorded", RunSpec(name="recorded"))
    applied = {
        "ort": {"requested": True, "applied": True},
        "fused_adam": {"requested": True, "applied": True},
        "zero1": {"requested": False, "applied": False},
    }
    from ortlab.train.metrics import JsonLinesSink

    sink = JsonLinesSink(run.metrics_path)
    sink({"event": "train_begin", "accelerations": applied})
    for step in range(1, steps + 1):
        sink(
            {
                "event": "step",
                "step": step,
                "loss": 1 / step,
                "samples_per_s": 10.0 + step % 3,
                "step_time_s": 0.5,
                "peak_mem_mb": 900.0,
                "samples": 16,
                "tokens": 512,
                "learning_rate": 1e-4,
                "epoch": step / steps,
            }
        )
        if step % 50 == 0:
            sink({"event": "eval", "step": step, "eval_loss": 2 / step, "eval_accuracy": 0.5 + step / 1000})
    sink({"event": "train_end", "step": steps, "accelerations": applied})
    sink.close()
    run.set_status("completed")
    return Run(run.path)


def test_monitor_draws_a_recorded_stream(tmp_path):
    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path)
    monitor = RunMonitor(throttle_s=0.05)
    monitor.add_run(run, follow=False)
    train_loss = next(t for t in monitor.figure.data if t.name.endswith("(train)"))
    eval_loss = next(t for t in monitor.figure.data if t.name.endswith("(eval)"))
    assert len(train_loss.x) == 200
    assert train_loss.y[0] == 1.0
    assert list(eval_loss.x) == [50, 100, 150, 200]
    assert "recorded [ort+fused_adam]" in train_loss.name  # the legend says what really applied
    assert len(monitor.figure.data) == 5  # 4 panels of train data + eval loss
    assert "recorded" in repr(monitor)
    monitor.close()


def test_live_updates_are_batched_and_throttled(tmp_path):
    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path, steps=1)
    monitor = RunMonitor(throttle_s=0.5)
    monitor.add_run(run, follow=False)
    sent_before = monitor.updates_sent

    def produce():
        for step in range(2, 202):  # 200 steps over ~2 s, as a fast run would write them
            monitor.consume(
                run.id,
                {
                    "event": "step",
                    "step": step,
                    "loss": 0.5,
                    "samples_per_s": 1.0,
                    "step_time_s": 0.1,
                    "peak_mem_mb": 1.0,
                },
            )
            time.sleep(0.01)

    started = time.monotonic()
    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    monitor.flush()
    elapsed = time.monotonic() - started
    sent = monitor.updates_sent - sent_before
    # One message batch per throttle period (plus the final flush) instead of one per point: 800 points here.
    assert sent <= elapsed / 0.5 + 2, (sent, elapsed)
    assert monitor.points_received == 4 + 800
    train_loss = next(t for t in monitor.figure.data if t.name.endswith("(train)"))
    assert len(train_loss.x) == 201  # nothing dropped
    monitor.close()


def test_static_view_where_widgets_cannot_render(workbench, tmp_path):
    bundle = workbench._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "static view" in bundle["text/html"]
    assert "max_steps: 7" in bundle["text/plain"]
    run = recorded_run(tmp_path)
    workbench._track(run, follow=False)
    text = repr(workbench)
    assert "recorded" in text
    assert "ort, fused_adam" in text
    assert "completed" in text


@pytest.mark.slow
def test_papermill_gets_the_static_view_not_an_error(tmp_path):
    import nbformat
    import papermill

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import ortlab\nortlab.Workbench(root={str(tmp_path / 'runs')!r})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "in.ipynb")
    papermill.execute_notebook(
        str(tmp_path / "in.ipynb"),
        str(tmp_path / "out.ipynb"),
        kernel_name="python3",
        progress_bar=False,
        cwd=str(tmp_path),
    )
    (output,) = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs
    assert output["output_type"] == "execute_result"
    assert "static view" in output["data"]["text/html"]
    assert "embedded:rotten-tomatoes" in output["data"]["text/plain"]


def test_a_new_workbench_finds_existing_runs(tmp_path):
    from ortlab.ui import Workbench

    run = recorded_run(tmp_path)
    wb = Workbench(root=str(run.path.parent))
    assert wb.run_list.options == ("recorded",)
    assert "recorded" in wb.comparison.value
    train_loss = next(t for t in wb.monitor.figure.data if t.name.endswith("(train)"))
    assert len(train_loss.x) == 200  # a finished run's history is drawn at once
    wb.monitor.close()
