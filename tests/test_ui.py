"""The workbench and the live charts, headless (no browser, no kernel): state, validation, a recorded stream,
throttling, and the static view shown where widgets cannot render."""

from __future__ import annotations

import time

import pytest

from ortlab.runfolder.rundir import RunDir
from ortlab.runner import Run
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


def test_the_adapter_and_trackers_reach_the_spec(workbench):
    assert workbench.adapter_rank.disabled is True
    workbench.lora.value = True
    assert workbench.adapter_rank.disabled is False
    workbench.adapter_rank.value = 4
    workbench.report_to.value = ("trackio", "tensorboard")
    spec = workbench.spec()
    assert (spec.adapter.kind, spec.adapter.rank, spec.report_to) == ("lora", 4, ["trackio", "tensorboard"])
    workbench.adapter_rank.value = 0
    assert workbench.launch_button.disabled is True
    assert "adapter.rank" in workbench.problems.value
    workbench.lora.value = False
    workbench.adapter_rank.value = 8
    assert workbench.spec().adapter.kind == "none" and workbench.launch_button.disabled is False


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


def test_the_mix_toggles_are_the_one_vocabulary(workbench):
    """The toggles, their labels and how they write the spec come from `ortlab.toggles`; fp16 and bf16 (one field)
    exclude each other, as in the sidebar; "measure the fastest" sets the fields a measurement decides."""
    from ortlab.toggles import form_toggles
    from ortlab.tune import TuneResult

    t = workbench.toggles
    assert [(n, box.description) for n, box in t.items()] == [(x.name, x.label) for x in form_toggles()]
    t["bf16"].value, t["fp16"].value = False, False
    t["fp16"].value = True
    t["bf16"].value = True  # unticks fp16 (the old workbench kept both, and fp16 won)
    assert (t["fp16"].value, workbench.spec().accel.precision) == (False, "bf16")
    t["fp16"].value = True
    assert (t["bf16"].value, workbench.spec().accel.precision) == (False, "fp16")
    t["fp16"].value = False
    t["torch_compile"].value, t["ort"].value = True, False
    spec = workbench.spec()
    assert spec.accel.precision == "fp32"
    assert {n for n, on in spec.asked_mix().requested().items() if on} == {n for n, box in t.items() if box.value}
    choice = {"ort": True, "fused_adam": False, "precision": "bf16", "torch_compile": False}
    result = TuneResult("ort+bf16", choice, [], 1, 1, 1.0, "key", {}, {})
    workbench.apply_tuned(result)
    assert t["ort"].value is not t["ort"].disabled and t["bf16"].value is not t["bf16"].disabled
    assert (t["fused_adam"].value, t["fp16"].value) == (False, False)
    assert t["torch_compile"].value is True, "a compiled mix needs its own runtime: the measurement leaves it"


def recorded_run(tmp_path, steps: int = 200, name: str = "recorded", extra: dict | None = None) -> Run:
    """A run folder holding a recorded metrics stream (as a finished ORT + fused Adam run writes it on a CPU;
    `extra` adds numbers to each step, e.g. a GPU's)."""
    run = RunDir.create(tmp_path / name, RunSpec(name=name))
    applied = {
        "ort": {"requested": True, "applied": True},
        "fused_adam": {"requested": True, "applied": True},
        "zero1": {"requested": False, "applied": False},
    }
    from ortlab.train.metricswriter import JsonLinesSink

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
                **(extra or {}),
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
    assert any(t.name.endswith("(eval)") for t in monitor.figure.data)
    xs, ys = monitor.drawn(run.id)
    assert len(xs) == 200 and ys[0] == 1.0
    assert monitor.drawn(run.id, "loss", "eval")[0] == [50, 100, 150, 200]
    assert "recorded [ort+fused_adam]" in train_loss.name  # the legend says what really applied
    assert len(monitor.figure.data) == 5  # 4 panels of train data + eval loss
    assert "recorded" in repr(monitor)
    monitor.close()


def test_live_updates_are_batched_and_throttled(tmp_path):
    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path, steps=1)
    # A throttle period longer than the test: no timed flush can fire, so what is counted is the batching itself.
    monitor = RunMonitor(throttle_s=3600)
    monitor.add_run(run, follow=False)
    monitor.flush()
    sent_before = monitor.updates_sent
    for step in range(2, 202):  # 200 steps, as a fast run writes them between two flushes
        monitor.consume(
            run.id,
            {"event": "step", "step": step, "loss": 0.5, "samples_per_s": 1.0, "step_time_s": 0.1, "peak_mem_mb": 1.0},
        )
    assert monitor.updates_sent == sent_before, "a point was sent on its own instead of waiting for the flush"
    monitor.flush()
    # One message batch for the whole period instead of one per point: 800 points here.
    assert monitor.updates_sent == sent_before + 1
    assert monitor.points_received == 4 + 800
    assert len(monitor.drawn(run.id)[0]) == 201  # nothing dropped
    monitor.close()

    # The flusher sends a buffered point by itself, one throttle period later (no flush() called).
    fast = RunMonitor(throttle_s=0.05)
    fast.add_run(run, follow=False)
    fast.flush()
    sent = fast.updates_sent
    fast.consume(run.id, {"event": "step", "step": 300, "loss": 0.4})
    deadline = time.monotonic() + 60
    while fast.updates_sent == sent and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fast.updates_sent == sent + 1
    fast.close()


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
    assert output["output_type"] == "display_data"  # with a display id: ortlab updates it as runs move on
    assert "static view" in output["data"]["text/html"]
    assert "embedded:rotten-tomatoes" in output["data"]["text/plain"]


def test_a_new_workbench_finds_existing_runs(tmp_path):
    from ortlab.ui import Workbench

    run = recorded_run(tmp_path)
    wb = Workbench(root=str(run.path.parent))
    assert wb.run_list.options == ("recorded",)
    assert "recorded" in wb.comparison.value
    assert len(wb.monitor.drawn("recorded")[0]) == 200  # a finished run's history is drawn at once
    wb.monitor.close()


# --- the static view: curves as SVG, kept true to the run -------------------------------------------------------


def test_static_view_draws_the_logged_losses_as_svg(tmp_path):
    from svg_points import assert_drawn, series

    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path, steps=200)
    monitor = RunMonitor()
    monitor.add_run(run, follow=False)
    page = monitor._repr_mimebundle_()["text/html"]
    monitor.close()
    records = run.metrics()
    steps = [r for r in records if r["event"] == "step"]
    evals = [r for r in records if r["event"] == "eval"]
    curves = series(page)
    assert set(curves) == {
        "recorded [ort+fused_adam] (train)",
        "recorded [ort+fused_adam] (eval)",
        "recorded [ort+fused_adam]",  # samples/s
    }
    train = curves["recorded [ort+fused_adam] (train)"]
    assert_drawn([x for x, _ in train], [r["step"] for r in steps], increasing=True)
    assert_drawn([y for _, y in train], [r["loss"] for r in steps], increasing=False)
    assert_drawn([y for _, y in curves["recorded [ort+fused_adam] (eval)"]], [r["eval_loss"] for r in evals], False)
    assert_drawn([y for _, y in curves["recorded [ort+fused_adam]"]], [r["samples_per_s"] for r in steps], False)
    # Theme-neutral: text and axes take the page's colour, nothing paints a background.
    assert 'fill="currentColor"' in page and "background" not in page


def test_static_chart_escapes_labels_and_survives_odd_data():
    from ortlab.ui.svg import Series, line_chart

    hostile = "<img src=x onerror=alert(1)>"
    s = Series(hostile, "#636efa")
    for x, y in [(1, 0.5), (2, float("nan")), (3, True), (4, 0.5)]:
        s.add(x, y)
    svg = line_chart(hostile, [s])
    assert "<img" not in svg and "&lt;img" in svg
    assert s.xs == [1.0, 4.0]  # NaN and a bool are not points
    assert "no points logged yet" in line_chart("loss", [Series("empty", "#000")])
    one = Series("one", "#000")
    one.add(1, 0.7)
    assert "<circle" in line_chart("loss", [one])  # a single point is still visible (a flat band around it)


def test_live_chart_reads_on_light_and_dark_themes(tmp_path):
    from ortlab.ui import RunMonitor

    first, second = recorded_run(tmp_path, steps=3, name="first"), recorded_run(tmp_path, steps=3, name="second")
    monitor = RunMonitor()
    monitor.add_run(first, follow=False)
    monitor.add_run(second, follow=False)
    layout = monitor.figure.layout
    assert layout.paper_bgcolor == "rgba(0,0,0,0)" and layout.plot_bgcolor == "rgba(0,0,0,0)"
    assert layout.font.color not in (None, "black", "white", "#000", "#fff")
    assert all(a.font.color == layout.font.color for a in layout.annotations)  # panel titles too
    assert layout.xaxis.gridcolor.startswith("rgba(128,128,128")
    # One colour per run across the panels, so that the loss panel's legend names every curve.
    colors: dict[str, set] = {}
    for trace in monitor.figure.data:
        colors.setdefault(trace.legendgroup, set()).add(trace.line.color)
        assert trace.marker.color == trace.line.color
    assert set(colors) == {"first", "second"}
    assert len(colors["first"]) == len(colors["second"]) == 1 and colors["first"] != colors["second"]
    monitor.close()


def test_gpu_panels_are_drawn_only_for_runs_that_have_gpu_numbers(tmp_path):
    from ortlab.ui import RunMonitor
    from ortlab.ui.charts import PANELS

    monitor = RunMonitor()
    monitor.add_run(recorded_run(tmp_path, steps=3, name="cpu"), follow=False)
    layout = monitor.figure.layout

    def shown() -> list[str]:
        titles = [title for _, title in PANELS]
        return [a.text for a in layout.annotations if a.text in titles and a.visible is not False]

    cpu_panels = ["loss (train, eval)", "samples/s", "step time (s)", "peak memory (MB)"]
    assert shown() == cpu_panels  # no empty MFU or GPU-memory panel on a CPU
    assert layout.xaxis5.visible is False and layout.yaxis6.visible is False
    assert layout.yaxis3.domain[0] == 0.0, "two rows fill the figure"
    # A GPU whose peak FLOP/s is unknown brings memory but no MFU: its panel alone joins, in a third row.
    gpu = recorded_run(tmp_path, steps=3, name="gpu", extra={"gpu_mem_reserved_mb": 2048.0})
    monitor.add_run(gpu, follow=False)
    assert shown() == [*cpu_panels, "GPU memory reserved (MB)"]
    assert layout.yaxis6.visible is True and layout.yaxis5.visible is False
    assert layout.yaxis6.domain[0] == 0.0 and layout.yaxis3.domain[0] > 0.0
    memory = [t for t in monitor.figure.data if t.xaxis == "x6"]
    assert [t.legendgroup for t in memory] == ["gpu"] and monitor.drawn("gpu", "gpu_mem_reserved_mb")[1] == [2048.0] * 3
    monitor.close()


class FakeShell:
    """Just enough of IPython's shell for `ortlab.ui.display`: its events."""

    def __init__(self):
        from IPython.core.events import EventManager, available_events

        self.events = EventManager(self, available_events)


def test_a_displayed_view_updates_its_saved_output_when_the_run_moves_on(tmp_path, monkeypatch):
    import os

    import IPython
    import IPython.display
    from svg_points import series

    import ortlab.runfolder.processes as processes
    from ortlab.train.metricswriter import JsonLinesSink
    from ortlab.ui import RunMonitor

    sent = []
    shell = FakeShell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: sent.append(("display", obj, kw)))
    monkeypatch.setattr(IPython.display, "update_display", lambda obj, **kw: sent.append(("update", obj, kw)))

    folder = RunDir.create(tmp_path / "live", RunSpec(name="live"))
    folder.update_status(pid=os.getpid(), create_time=processes.process_create_time(os.getpid()))
    folder.set_status("running")
    sink = JsonLinesSink(folder.metrics_path)
    step = {"event": "step", "samples_per_s": 10.0, "step_time_s": 0.1, "samples": 8, "tokens": 64}
    for i in (1, 2):
        sink({**step, "step": i, "loss": 1.0 / i})
    monitor = RunMonitor()
    monitor.add_run(Run(folder.path), follow=False)
    monitor._ipython_display_()  # what IPython calls for the cell's last expression
    ((kind, bundle, kw),) = sent
    assert kind == "display" and kw["raw"] and kw["display_id"].startswith("ortlab-")
    assert ">running<" in bundle["text/html"]
    shell.events.trigger("post_run_cell", None)  # a cell ran, nothing changed: nothing sent (no redraw)
    assert len(sent) == 1

    for i in (3, 4):  # the run goes on and ends, while the user's next cell waits for it
        sink({**step, "step": i, "loss": 1.0 / i})
    sink.close()
    folder.set_status("completed")
    shell.events.trigger("post_run_cell", None)
    kind, bundle, kw2 = sent[-1]
    assert kind == "update" and kw2["display_id"] == kw["display_id"]
    assert ">completed<" in bundle["text/html"] and ">running<" not in bundle["text/html"]
    (train,) = [p for label, p in series(bundle["text/html"]).items() if label.endswith("(train)")]
    assert len(train) == 4  # the final curve, read from the run folder
    shell.events.trigger("post_run_cell", None)
    assert len(sent) == 2
    monitor.close()
    shell.events.trigger("post_run_cell", None)  # a closed view stops watching
    assert shell.events.callbacks["post_run_cell"] == []


@pytest.mark.slow
def test_an_executed_notebook_keeps_the_finished_run_not_pending(tmp_path):
    """In a real kernel, through papermill: the cell that displayed the monitor ends up showing the run as it
    ended in a later cell."""
    import nbformat
    import papermill
    from svg_points import series

    cells = [
        "import os\n"
        "from ortlab.runner import Run\n"
        "from ortlab.runfolder.processes import process_create_time\n"
        "from ortlab.runfolder.rundir import RunDir\n"
        "from ortlab.spec import RunSpec\n"
        "from ortlab.train.metricswriter import JsonLinesSink\n"
        "folder = RunDir.create('run', RunSpec(name='nb'))\n"
        "folder.update_status(pid=os.getpid(), create_time=process_create_time(os.getpid()))\n"
        "folder.set_status('running')\n"
        "sink = JsonLinesSink(folder.metrics_path)\n"
        "step = {'event': 'step', 'samples_per_s': 10.0, 'step_time_s': 0.1, 'samples': 8, 'tokens': 64}\n"
        "sink({**step, 'step': 1, 'loss': 0.9})",
        "import ortlab.ui\nortlab.ui.RunMonitor(Run(folder.path))",
        "for i in range(2, 6):\n    sink({**step, 'step': i, 'loss': 1.0 / i})\n"
        "sink.close()\nfolder.set_status('completed')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "in.ipynb")
    papermill.execute_notebook(
        str(tmp_path / "in.ipynb"),
        str(tmp_path / "out.ipynb"),
        kernel_name="python3",
        progress_bar=False,
        cwd=str(tmp_path),
    )
    (output,) = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[1].outputs
    page = output["data"]["text/html"]
    assert ">completed<" in page and ">running<" not in page
    (train,) = [p for label, p in series(page).items() if label.endswith("(train)")]
    assert len(train) == 5


def test_check_this_machine_probes_in_the_background_and_updates_the_notes(tmp_path, monkeypatch):
    import ortlab.probe
    from ortlab.accel import Availability
    from ortlab.ui import Workbench

    monkeypatch.setattr(ortlab.probe, "cached_report", lambda python=None: None)  # never probed here
    wb = Workbench(spec={"accel": {"ort": True}}, root=str(tmp_path))
    assert not wb.probed
    assert "(not probed)" not in "".join(n.value for n in wb.notes.values())  # said once, above the toggles
    assert "installed:" in wb.notes["zero1"].value and "ok:" not in wb.notes["zero1"].value
    assert "check this machine" in wb.check_note.value and wb.check_button.description == "check this machine"

    asked = []

    def fake_doctor(python=None, refresh=False):
        asked.append(refresh)
        accelerations = {name: Availability(name, True, f"{name} tried", "nothing to do") for name in wb.notes}
        accelerations["ort"] = Availability("ort", False, "ORTModule failed a tiny training step: <boom>", "fix it")
        return ortlab.probe.DoctorReport(
            python="3.11",
            executable="python",
            platform="linux",
            torch="2.6.0",
            cuda=None,
            devices=[],
            packages={},
            accelerations=accelerations,
            probed_at=0.0,
        )

    monkeypatch.setattr(ortlab.probe, "doctor", fake_doctor)
    assert wb.toggles["ort"].value is True  # the spec asks for ORT
    wb.check_machine().join(10)
    assert asked == [False] and wb.probed
    assert "ok: zero1 tried" in wb.notes["zero1"].value
    assert "&lt;boom&gt;" in wb.notes["ort"].value
    assert wb.toggles["ort"].disabled and wb.toggles["ort"].value is False  # switched off: it cannot run here
    assert wb.check_button.description == "check again" and not wb.check_button.disabled
    assert "tried for real" in wb.check_note.value
    wb.check_machine().join(10)
    assert asked == [False, True]  # a second check probes again
    wb.monitor.close()


def test_the_target_picker_offers_local_other_python_and_a_cluster(workbench):
    assert workbench.where.options == ("local", "other Python", "cluster")
    assert workbench.spec().target.cluster is None and workbench.cluster.layout.display == "none"
    workbench.where.value = "cluster"
    assert workbench.cluster.layout.display is None and workbench.python.layout.display == "none"
    assert workbench.check_button.description == "check the cluster"
    assert workbench.spec().target.cluster == "local", "an empty address means the local head"
    workbench.cluster.value = "ftp://nowhere"
    assert workbench.launch_button.disabled is True and "target.cluster" in workbench.problems.value
    workbench.cluster.value = "http://10.0.0.5:8265"
    assert workbench.spec().target.cluster == "http://10.0.0.5:8265" and workbench.launch_button.disabled is False
    # A cluster run's workers, storage and restarts (Ray Train), shown only for a cluster.
    assert workbench.processes.description == "workers" and workbench.storage.layout.display is None
    workbench.processes.value, workbench.max_failures.value, workbench.storage.value = 2, 1, " /shared/runs "
    target = workbench.spec().target
    assert (target.processes, target.max_failures, target.storage) == (2, 1, "/shared/runs")
    workbench.where.value = "local"
    assert workbench.spec().target.cluster is None
    assert workbench.spec().target.max_failures == 0 and workbench.spec().target.storage is None
    assert workbench.processes.description == "processes" and workbench.max_failures.layout.display == "none"


@pytest.fixture
def reworded_learning_rate():
    """RunSpec with hyper.learning_rate's description reworded (the models rebuilt, then restored): what a
    contributor's edit of ortlab/spec.py does."""
    from ortlab.spec import HyperSpec

    info = HyperSpec.model_fields["learning_rate"]
    before = info.description
    info.description = "Reworded: <b>how big</b> each optimizer step is."
    HyperSpec.model_rebuild(force=True)
    RunSpec.model_rebuild(force=True)
    try:
        yield info.description
    finally:
        info.description = before
        HyperSpec.model_rebuild(force=True)
        RunSpec.model_rebuild(force=True)


def test_the_widgets_take_choices_defaults_and_tooltips_from_the_spec_schema(reworded_learning_rate, tmp_path):
    """The workbench copies nothing from the spec: a reworded description is the tooltip at once, the task list
    is the schema's (seq2seq included), and a blank workbench starts at the spec's defaults."""
    from ortlab.spec import TASKS, DataSpec, HyperSpec
    from ortlab.ui import Workbench
    from ortlab.ui.form import TOOLTIP  # (ipywidgets 8's name, or 7's)

    wb = Workbench(root=str(tmp_path))
    try:
        assert getattr(wb.learning_rate, TOOLTIP) == reworded_learning_rate
        assert getattr(wb.batch_size, TOOLTIP) == HyperSpec.model_fields["batch_size"].description
        assert getattr(wb.max_steps, TOOLTIP).startswith(HyperSpec.model_fields["max_steps"].description)
        assert wb.task.options == TASKS and "seq2seq" in wb.task.options
        assert getattr(wb.text_column, TOOLTIP) == DataSpec.model_fields["text_column"].description
        wb.task.value = "seq2seq"  # the pair of column fields edits source/target now: their descriptions follow
        assert getattr(wb.text_column, TOOLTIP) == DataSpec.model_fields["source_column"].description
        assert getattr(wb.label_column, TOOLTIP) == DataSpec.model_fields["target_column"].description
        defaults = RunSpec()
        h = defaults.hyper
        assert (wb.batch_size.value, wb.learning_rate.value) == (h.batch_size, h.learning_rate)
        assert wb.max_train_samples.value == defaults.data.max_train_samples  # a factory default, not in the schema
        wb.task.value = "sequence-classification"
        # An untouched workbench is the default spec (the toggles make the mix explicit: what `auto` resolves to).
        blank = RunSpec.parse({"output_dir": str(tmp_path)}).model_dump(exclude={"accel"})
        assert wb.spec().model_dump(exclude={"accel"}) == blank
    finally:
        wb.monitor.close()


# --- the live view's cost per refresh does not grow with the run -------------------------------------------------


def _messages(chart) -> list[dict]:
    """Record every message the chart's widget sends to the browser (the comm's content, as it goes out)."""
    sent: list[dict] = []
    send = chart.send

    def recording(content, buffers=None):
        sent.append(content)
        return send(content, buffers)

    chart.send = recording
    return sent


def _refreshes(monitor, run, first_step: int, count: int) -> list[tuple[dict, int]]:
    """`count` refreshes of 2 new steps each, as a live run brings them between two flushes: each refresh's message
    and its size in bytes (JSON, as the comm carries it)."""
    import json

    sent = _messages(monitor.chart)
    out = []
    for step in range(first_step, first_step + 2 * count):
        record = {"event": "step", "step": step, "loss": 0.01, "samples_per_s": 9.0, "step_time_s": 0.5}
        monitor.consume(run.id, {**record, "peak_mem_mb": 900.0})
        if (step - first_step) % 2 == 1:
            monitor.flush()
            (message,) = sent[-1:]
            out.append((message, len(json.dumps(message, separators=(",", ":")))))
    return out


def test_a_refresh_sends_only_the_new_points_whatever_the_run_length(tmp_path):
    """The kernel side of "only new points travel": a refresh of 2 new steps carries, per curve, the points to
    append and how many the browser keeps, and its size is the same for a 60-step run and a 6,000-step one (but
    for the refresh that redraws a curve whose length doubled, which must be rare). The drawn curve stays true."""
    from ortlab.ui import RunMonitor

    bound = 100
    sizes, points = {}, {}
    for steps in (60, 6_000):
        run = recorded_run(tmp_path, steps=steps, name=f"run-{steps}")
        monitor = RunMonitor(throttle_s=3600, max_points=bound)
        monitor.add_run(run, follow=False)
        refreshes = _refreshes(monitor, run, steps + 1, 40)
        assert len(refreshes) == 40 and all(m["type"] == "points" for m, _ in refreshes)
        appends = [(m, size) for m, size in refreshes if all(keep > 0 for _, keep, _, _ in m["ops"])]
        assert len(appends) >= 38, "a whole curve was sent more than once per doubling"
        # 4 curves (loss, samples/s, step time, memory), each: 2 new points (or a finished bucket's min and max)
        # and the unfinished bucket's min, max and last point.
        for message, _ in appends:
            assert len(message["ops"]) == 4
            assert all(len(xs) == len(ys) <= 2 + 3 for _, _, xs, ys in message["ops"])
        sizes[steps] = max(size for _, size in appends)
        points[steps] = max(sum(len(xs) for _, _, xs, _ in m["ops"]) for m, _ in appends)
        # What the browser holds after applying every message is what the kernel says is drawn.
        xs, ys = monitor.drawn(run.id)
        assert len(xs) <= bound + 3 and ys[0] == 1.0 and xs[-1] == steps + 80
        if steps > bound:
            assert max(ys) == 1.0 and min(ys) == 1 / steps  # the envelope survives the buckets
            full_x, _ = monitor.series(run.id, "loss")
            assert len(full_x) == steps + 80  # every point, for an export
        monitor.close()
    assert points[6_000] <= points[60] + 4
    # Same number of points; the step numbers have more digits: a few bytes, not a curve's worth.
    assert sizes[6_000] <= sizes[60] + 200, sizes


def test_a_view_that_opens_gets_every_curve_once_then_appends(tmp_path):
    """A browser view asks for a snapshot when it opens: each curve whole (bounded), after which appends fit."""
    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path, steps=500)
    monitor = RunMonitor(throttle_s=3600, max_points=100)
    monitor.add_run(run, follow=False)
    sent = _messages(monitor.chart)
    monitor.chart._on_message(monitor.chart, {"type": "snapshot"}, [])
    (snapshot,) = sent
    assert snapshot["snapshot"] is True and all(keep == 0 for _, keep, _, _ in snapshot["ops"])
    held = {index: (list(xs), list(ys)) for index, _, xs, ys in snapshot["ops"]}
    assert all(len(xs) <= 103 for xs, _ in held.values()) and len(held) == len(monitor.figure.data)
    for step in range(501, 521):
        monitor.consume(run.id, {"event": "step", "step": step, "loss": 0.5})
        monitor.flush()
    for message in sent[1:]:
        for index, keep, xs, ys in message["ops"]:
            assert keep <= len(held[index][0])
            held[index] = (held[index][0][:keep] + xs, held[index][1][:keep] + ys)
    loss = next(i for i, t in enumerate(monitor.figure.data) if t.name.endswith("(train)"))
    assert held[loss] == monitor.drawn(run.id)
    # The browser's reports of its drawing time space the refreshes: 0.5 s fastest, slower for a slow browser.
    from ortlab.ui.livechart import ASSUMED_RENDER_S, SHARE

    chart = monitor.chart
    chart.kernel_s = 0.0
    # Before any report, an assumed drawing time (a short run's first refreshes are where most of its cost was).
    assert chart.interval(0.5) == pytest.approx(ASSUMED_RENDER_S / SHARE) and ASSUMED_RENDER_S / SHARE > 0.5
    for _ in range(20):
        chart._on_message(chart, {"type": "rendered", "ms": 5.0}, [])
    assert chart.interval(0.5) == 0.5  # a fast browser: the monitor's fastest
    for _ in range(20):
        chart._on_message(chart, {"type": "rendered", "ms": 40.0}, [])
    assert 1.4 < chart.interval(0.5) <= 5.0  # 40 ms of drawing is 2.5 % of a core at 1.6 s
    chart._on_message(chart, {"type": "rendered", "ms": "a lot"}, [])  # ignored, not an error
    monitor.close()


def test_the_chart_loads_plotly_js_from_the_installed_package_and_escapes_legends(tmp_path):
    from ortlab.ui import RunMonitor

    run = recorded_run(tmp_path, steps=3)
    monitor = RunMonitor()
    monitor.add_run(run, follow=False)
    # An acceleration's name comes from the run's metrics file: hostile, and plotly draws legends as HTML.
    monitor.consume(run.id, {"event": "train_end", "accelerations": {"<b>x</b>&": {"applied": True}}})
    monitor.flush()
    sent = []
    monitor.chart.send = lambda content, buffers=None: sent.append((content, buffers))
    monitor.chart._on_message(monitor.chart, {"type": "plotly"}, [])
    ((content, (source,)),) = sent
    assert content == {"type": "plotly"} and b"plotly.js v" in source[:200] and len(source) > 1_000_000
    names = [t["name"] for t in monitor.chart.traces]
    assert names and all("[&lt;b&gt;x&lt;/b&gt;&amp;]" in n and "<b>" not in n for n in names)
    assert "extendTraces" in monitor.chart._esm and "http" not in monitor.chart._esm  # nothing from the network
    monitor.close()


def test_the_charts_state_leaves_the_widgets_own_traits_alone():
    """plotly's layout was once the chart's `layout` trait: that replaced ipywidgets' `Layout` model, and the
    browser's DOMWidgetView, making a view of that dict, threw "Cannot read properties of undefined (reading
    'then')" as each chart was shown (#42; tests/test_browser.py now fails on page errors)."""
    import anywidget
    import ipywidgets

    from ortlab.ui.livechart import LiveChart

    assert not set(LiveChart.class_own_traits()) & set(anywidget.AnyWidget.class_trait_names())
    chart = LiveChart()
    assert isinstance(chart.layout, ipywidgets.Layout)
    chart.close()


def test_a_refresh_does_not_rebuild_the_static_summary(tmp_path, monkeypatch):
    import ortlab.ui.charts as charts
    import ortlab.ui.summary as summary

    built = []
    real = summary.static_summary
    monkeypatch.setattr(charts, "static_summary", lambda *a, **k: built.append(1) or real(*a, **k))
    run = recorded_run(tmp_path, steps=20)
    monitor = charts.RunMonitor(throttle_s=3600)
    monitor.add_run(run, follow=False)
    for step in range(21, 41):
        monitor.consume(run.id, {"event": "step", "step": step, "loss": 0.1})
        monitor.flush()
    assert monitor.updates_sent >= 20
    assert built == []  # built when displayed or when a run's state changes (ortlab.ui.display), not per refresh
    monitor.close()


def test_the_monitor_imports_pandas_before_its_threads_start():
    """plotly imports pandas lazily on a figure's first update; on the monitor's flush thread, racing a notebook
    cell that imports pandas, one of them saw a partially initialised module. The monitor imports it first, in the
    caller's thread (a fresh process: nothing before it imported pandas)."""
    import subprocess
    import sys

    probe = (
        "import sys\nimport ortlab.ui.charts as charts\nbefore = 'pandas' in sys.modules\n"
        "monitor = charts.RunMonitor()\nprint(before, 'pandas' in sys.modules)\nmonitor.close()"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
