"""`ortlab.Workbench()`: pick a model, data and an acceleration mix, launch and stop runs, watch and compare.

The widgets only edit a RunSpec: `workbench.spec()` is what Launch would start, and every change is validated
with the same RunSpec rules as the CLI (Launch stays disabled, with the reason shown, while the spec is
invalid). Runs are launched with `ortlab.launch` and watched through their run folders, so a workbench opened
again (in the same or a new kernel) finds its runs and re-attaches to the running ones.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from ortlab.errors import OrtlabError
from ortlab.specfields import SpecFields, get_path, set_path
from ortlab.ui.charts import RunMonitor
from ortlab.ui.display import RefreshedDisplay
from ortlab.ui.summary import generations_html, rows, static_summary, table_html

ACCELS = ("ort", "fused_adam", "zero1", "bf16", "fp16", "torch_compile")
WIDE = widgets.Layout(width="420px")
# Labels such as "learning rate" are wider than ipywidgets' default label column: size it to fit them whole.
LABEL = {"description_width": "100px"}
# The two column fields: a text and its label, or (seq2seq) a source and the target text to produce from it.
COLUMN_LABELS = {"seq2seq": ("source col", "target col")}
TEXT_LABEL_COLUMNS = ("text col", "label col")
COLUMN_FIELDS = {"seq2seq": ("data.source_column", "data.target_column")}
TEXT_LABEL_FIELDS = ("data.text_column", "data.label_column")
# causal-lm chat data: a messages column, or a prompt and a response column (TRL's formats), and packing.
CHAT_FIELDS = ("data.messages_column", "data.prompt_column", "data.response_column", "data.packing")


def _availability() -> tuple[dict[str, Any], Any]:
    """What this runtime can run, and the doctor's report it comes from: its cached report when this environment
    was probed before (`ortlab doctor`; instant), else the static checks (instant too; report None). The workbench
    never waits for probes on opening: they take 10-40 s, and most workbenches (every test's included) never need
    them. The "check this machine" button runs them on request, in the background."""
    from ortlab.probe import cached_report

    report = cached_report()
    if report is not None:
        return dict(report.accelerations), report
    from ortlab.accel import fused_adam, ort, precision, torch_compile, zero

    return {
        "ort": ort.check(),
        "fused_adam": fused_adam.check(),
        "zero1": zero.check(),
        "bf16": precision.check_bf16(),
        "fp16": precision.check_fp16(),
        "torch_compile": torch_compile.check(),
    }, None


def _note_html(a: Any, probed: bool) -> str:
    """One toggle's note. Unprobed, an available acceleration is only "installed" (its versions and files are
    right; nothing was tried), and the "(not probed)" of each reason is said once, above the toggles, instead."""
    from ortlab.accel import NOT_PROBED

    if not a.available:
        mark = "unavailable"
    elif not probed:
        mark = "installed"
    else:
        mark = "slow" if a.slow else "ok"
    reason = a.reason if probed else a.reason.replace(NOT_PROBED, "")
    tip = html.escape(a.remedy, quote=True)
    return f"<span title='{tip}'><small>{mark}: {html.escape(reason)}</small></span>"


def _checked_html(report: Any) -> str:
    """Where the toggles' notes come from, said once above them."""
    if report is None:
        return (
            "<small>quick checks only (installed versions and files). <b>check this machine</b> tries each "
            "acceleration for real, as <code>ortlab doctor</code> does: 10-40 s once, in the background, then "
            "remembered for this environment.</small>"
        )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.probed_at)) if report.probed_at else "earlier"
    return f"<small>tried for real on this machine ({html.escape(when)}; <code>ortlab doctor</code>)</small>"


def _small(text: str) -> str:
    return f"<small>{html.escape(text)}</small>"


def _run_tune(spec: Any, progress: Any) -> Any:
    """`python -m ortlab.cli tune SPEC --json`: its progress lines (stderr) to `progress`, its result parsed."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from ortlab.tune import TuneResult

    with tempfile.TemporaryDirectory(prefix="ortlab-tune-spec-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(spec.to_json())
        proc = subprocess.Popen(
            [sys.executable, "-m", "ortlab.cli", "tune", str(path), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        last = ""
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            line = line.strip()
            if line.startswith(("tune:", "data:", "error:")):
                last = line
                progress(line)
        out = proc.stdout.read()
        if proc.wait() != 0:
            raise RuntimeError(last or f"ortlab tune exited with {proc.returncode}")
    return TuneResult.from_dict(json.loads(out))


def _tune_table_html(result: Any) -> str:
    def cell(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else "-"

    rows_html = "".join(
        "<tr>"
        + "".join(
            f"<td style='padding:0 8px'>{html.escape(v)}</td>"
            for v in (
                m.name,
                cell(m.samples_per_s, ".1f"),
                cell(m.ratio, ".2f") + ("x" if m.ratio is not None else ""),
                cell(m.warmup_s, ".1f"),
                m.verdict,
            )
        )
        + "</tr>"
        for m in result.candidates
    )
    head = "".join(
        f"<th style='padding:0 8px;text-align:left'>{h}</th>"
        for h in ("mix", "samples/s", "vs plain", "warm-up s", "verdict")
    )
    return f"<table class='ortlab-tune'><tr>{head}</tr>{rows_html}</table>"


class Workbench(RefreshedDisplay, widgets.VBox):
    """The ortlab workbench. `Workbench(spec={...})` starts from a spec (a dict or RunSpec) instead of the
    embedded default; `root` is the runs folder (default ./ortlab-runs)."""

    def __init__(self, spec: Any = None, root: str | None = None, **kwargs: Any):
        from ortlab.spec import TRACKERS, RunSpec

        self.root = root
        start = spec if isinstance(spec, RunSpec) else RunSpec.parse(spec or {})
        self._base = start.model_dump(mode="json")
        # The fields' choices and descriptions (the tooltips) come from RunSpec's schema, not from copies here.
        self.fields = SpecFields()
        # The widgets that edit one spec field each, by the field's path: `spec_dict` writes them back by path.
        self.by_path: dict[str, widgets.ValueWidget] = {}
        self.available, self.report = _availability()
        self.notes: dict[str, widgets.HTML] = {}
        self._runs: dict[str, Any] = {}

        # model and data
        self.model = self._field(
            widgets.Combobox,
            "model.name",
            placeholder="Hub id or local folder",
            description="model",
            layout=WIDE,
            ensure_option=False,
        )
        self.model_search = widgets.Button(description="search", layout=widgets.Layout(width="80px"))
        self.model_info = widgets.HTML()
        self.data = self._field(
            widgets.Combobox,
            "data.source",
            description="data",
            layout=WIDE,
            placeholder="Hub id, file or folder, embedded:NAME",
            ensure_option=False,
        )
        self.data_inspect = widgets.Button(description="inspect", layout=widgets.Layout(width="80px"))
        self.data_preview = widgets.HTML()
        self.task = self._field(widgets.Dropdown, "task", options=list(self.fields.choices("task")), description="task")
        # One pair of column fields for every task; for seq2seq they name the source and the target column.
        first, second = COLUMN_FIELDS.get(start.task, TEXT_LABEL_FIELDS)
        self.text_column = widgets.Text(value=get_path(self._base, first) or "", placeholder="auto")
        self.label_column = widgets.Text(value=get_path(self._base, second) or "", placeholder="auto")
        self._label_columns()
        self.messages_column, self.prompt_column, self.response_column = (
            self._field(widgets.Text, f"data.{what}_column", placeholder="auto", description=what)
            for what in ("messages", "prompt", "response")
        )
        self.packing = self._field(widgets.Checkbox, "data.packing", description="packing", indent=False)
        self.chat_box = widgets.HBox([self.messages_column, self.prompt_column, self.response_column, self.packing])

        # the acceleration mix: a toggle each, with what the doctor says
        from ortlab.accel.mix import resolve

        resolved = resolve(start.accel)
        initial = {
            "ort": resolved.ort,
            "fused_adam": resolved.fused_adam,
            "zero1": start.accel.zero_stage > 0,
            "bf16": start.accel.precision == "bf16",
            "fp16": start.accel.precision == "fp16",
            "torch_compile": start.accel.torch_compile,
        }
        self.toggles: dict[str, widgets.Checkbox] = {}
        accel_rows = []
        for name in ACCELS:
            a = self.available[name]
            box = widgets.Checkbox(
                value=bool(initial[name]) and a.available,
                description=name,
                indent=False,
                disabled=not a.available,
                layout=widgets.Layout(width="130px"),
            )
            self.toggles[name] = box
            self.notes[name] = widgets.HTML(_note_html(a, self.probed))
            accel_rows.append(widgets.HBox([box, self.notes[name]]))

        self.check_button = widgets.Button(
            description="check again" if self.probed else "check this machine",
            tooltip="try each acceleration for real (10-40 s, in the background)",
            layout=widgets.Layout(width="max-content"),
        )
        self.check_note = widgets.HTML(_checked_html(self.report))
        self._check_thread: threading.Thread | None = None
        self.tune_button = widgets.Button(
            description="measure the fastest",
            tooltip="train each mix a few steps on this model and data, then switch on the fastest (about a minute)",
            layout=widgets.Layout(width="max-content"),
        )
        self.tune_note = widgets.HTML()
        self._tune_thread: threading.Thread | None = None

        # hyperparameters and target
        self.learning_rate = self._field(widgets.FloatText, "hyper.learning_rate", description="learning rate")
        self.epochs = self._field(widgets.FloatText, "hyper.epochs", description="epochs")
        self.max_steps = self._field(widgets.IntText, "hyper.max_steps", description="max steps")
        self.batch_size = self._field(widgets.IntText, "hyper.batch_size", description="batch size")
        self.max_length = self._field(widgets.IntText, "hyper.max_length", description="max length")
        self.max_train_samples = self._field(widgets.IntText, "data.max_train_samples", description="train rows")
        # what trains (every weight, or a LoRA adapter) and where the metrics also go
        self.lora = widgets.Checkbox(
            value=start.adapter.kind == "lora",
            description="LoRA adapter",
            indent=False,
            tooltip=self.fields.tip("adapter.kind"),
            layout=widgets.Layout(width="130px"),
        )
        self.adapter_rank = self._field(
            widgets.IntText, "adapter.rank", description="rank", disabled=start.adapter.kind != "lora"
        )
        self.report_to = self._field(
            widgets.SelectMultiple, "report_to", options=list(TRACKERS), description="trackers", rows=len(TRACKERS)
        )
        self.processes = self._field(widgets.IntText, "target.processes", description="processes")
        self.python = widgets.Text(
            value=start.target.python or "",
            description="runtime",
            placeholder="this Python",
            tooltip=self.fields.tip("target.python"),
        )
        # Where the run goes: this machine, another Python here, or a Ray cluster (its address, or 'local').
        where = "cluster" if start.target.cluster else "other Python" if start.target.python else "local"
        self.where = widgets.Dropdown(options=["local", "other Python", "cluster"], value=where, description="where")
        self.cluster = widgets.Text(
            value=start.target.cluster or "",
            description="cluster",
            placeholder="local or http://HOST:8265",
            tooltip=self.fields.tip("target.cluster"),
        )
        self.name = self._field(widgets.Text, "name", description="run name", placeholder="automatic")

        # actions, state
        self.launch_button = widgets.Button(description="Launch", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="warning", icon="stop")
        self.problems = widgets.HTML()
        self.run_list = widgets.Select(options=[], description="runs", rows=5, layout=WIDE)
        self.baseline = widgets.Dropdown(options=[], description="baseline")
        self.comparison = widgets.HTML()
        self.generations = widgets.HTML()  # what the selected run's model says (chat runs), next to the charts
        self.monitor = RunMonitor()
        self.monitor.on_change = self._refresh_soon
        self._last_refresh = 0.0

        form = widgets.VBox(
            [
                widgets.HTML("<h3>ortlab workbench</h3>"),
                widgets.HBox([self.model, self.model_search]),
                self.model_info,
                widgets.HBox([self.data, self.data_inspect]),
                self.data_preview,
                widgets.HBox([self.task, self.text_column, self.label_column]),
                self.chat_box,
                widgets.HBox([widgets.HTML("<b>acceleration mix</b>"), self.check_button, self.check_note]),
                *accel_rows,
                widgets.HBox([self.tune_button, self.tune_note]),
                widgets.HTML("<b>training</b>"),
                widgets.HBox([self.learning_rate, self.epochs, self.max_steps]),
                widgets.HBox([self.batch_size, self.max_length, self.max_train_samples]),
                widgets.HBox([self.lora, self.adapter_rank, self.report_to]),
                widgets.HBox([self.processes, self.where, self.python, self.cluster, self.name]),
                widgets.HBox([self.launch_button, self.stop_button]),
                self.problems,
            ]
        )
        runs_box = widgets.VBox([widgets.HBox([self.run_list, self.baseline]), self.comparison, self.generations])
        super().__init__([form, runs_box, self.monitor], **kwargs)

        for w in (
            *self.by_path.values(),
            self.text_column,
            self.label_column,
            self.python,
            self.where,
            self.cluster,
            self.lora,
            *self.toggles.values(),
        ):
            w.observe(lambda _change: self.validate(), names="value")
        self.lora.observe(lambda change: setattr(self.adapter_rank, "disabled", not change["new"]), names="value")
        self.where.observe(lambda _change: self._show_target(), names="value")
        self._show_target()
        self.task.observe(lambda _change: self._label_columns(), names="value")
        self.baseline.observe(lambda _change: self.refresh_comparison(), names="value")
        self.run_list.observe(lambda _change: self.refresh_generations(), names="value")
        self.model_search.on_click(lambda _b: self.search_models())
        self.data_inspect.on_click(lambda _b: self.inspect_data())
        self.launch_button.on_click(lambda _b: self.launch())
        self.stop_button.on_click(lambda _b: self.stop())
        self.check_button.on_click(lambda _b: self.check_machine())
        self.tune_button.on_click(lambda _b: self.measure_fastest())
        # Stable hooks for tests and user CSS.
        self.add_class("ortlab-workbench")
        self.launch_button.add_class("ortlab-launch")
        self.stop_button.add_class("ortlab-stop")
        self.validate()
        self.reattach()

    def _field(self, cls: type, path: str, **kw: Any) -> Any:
        """A widget that edits the spec field at `path`: it starts at the starting spec's value (the spec's
        default unless given), its tooltip is the field's description from RunSpec's schema, and `spec_dict`
        reads it back by the same path."""
        value = get_path(self._base, path)
        if value is None:  # an unset optional field: an empty text, or 0 for a number (its tooltip says so)
            value = 0 if issubclass(cls, (widgets.IntText, widgets.FloatText)) else ""
        if isinstance(value, list):
            value = tuple(value)
        kw.setdefault("tooltip", self.fields.tip(path))
        if issubclass(cls, (widgets.IntText, widgets.FloatText)):
            kw.setdefault("style", LABEL)
        w = cls(value=value, **kw)
        self.by_path[path] = w
        return w

    @property
    def probed(self) -> bool:
        """Whether the toggles' notes come from real probes (the doctor's report), not only static checks."""
        return self.report is not None

    # --- what this machine can run -------------------------------------------------------------------------

    def check_machine(self) -> threading.Thread:
        """Probe this environment (the doctor, `refresh` when it was probed before) in a background thread, then
        update the toggles' notes and which toggles can be switched on. The probes run in their own processes:
        the kernel stays free, and a crashing ORT build cannot take it down. Returns the thread (tests join it)."""
        if self._check_thread is not None and self._check_thread.is_alive():
            return self._check_thread
        self.check_button.disabled = True
        self.check_note.value = "<small>checking: each acceleration is tried for real in its own process...</small>"

        def work() -> None:
            from ortlab.probe import DoctorReport, doctor

            try:
                if self.where.value == "cluster":  # the cluster's own doctor, run there as a short job
                    from ortlab.runner import target_doctor

                    report = DoctorReport.from_dict(target_doctor(self.spec()))
                else:
                    report = doctor(refresh=self.probed)
            except Exception as e:  # say what failed next to the button; the notes keep what was known
                self.check_note.value = f"<small style='color:#b00'>the check failed: {html.escape(str(e))}</small>"
            else:
                self.show_availability(report)
            finally:
                self.check_button.disabled = False

        self._check_thread = threading.Thread(target=work, daemon=True, name="ortlab-check-machine")
        self._check_thread.start()
        return self._check_thread

    def measure_fastest(self) -> threading.Thread:
        """`ortlab tune` on the current spec, in its own process (the kernel stays free and imports no torch),
        its progress shown beside the button; then the toggles are set to the mix it found fastest and its table
        is shown. Returns the thread (tests join it)."""
        if self._tune_thread is not None and self._tune_thread.is_alive():
            return self._tune_thread
        try:
            spec = self.spec()
        except Exception as e:  # the spec's own problems are listed under Launch already
            self.tune_note.value = f"<small>fix the spec first: {html.escape(str(e).splitlines()[0])}</small>"
            return threading.Thread(target=lambda: None)
        self.tune_button.disabled = True
        self.tune_note.value = "<small>measuring: starting the candidates...</small>"

        def work() -> None:
            try:
                result = _run_tune(spec, lambda line: setattr(self.tune_note, "value", _small(line)))
            except Exception as e:  # shown beside the button; the toggles stay as they were
                self.tune_note.value = f"<small style='color:#b00'>{html.escape(str(e))}</small>"
            else:
                self.apply_tuned(result)
            finally:
                self.tune_button.disabled = False

        self._tune_thread = threading.Thread(target=work, daemon=True, name="ortlab-tune")
        self._tune_thread.start()
        return self._tune_thread

    def apply_tuned(self, result: Any) -> None:
        """Switch the mix toggles to `result`'s choice (a `TuneResult`) and show its table."""
        choice = result.choice
        wanted = {
            "ort": bool(choice.get("ort")),
            "fused_adam": bool(choice.get("fused_adam")),
            "bf16": choice.get("precision") == "bf16",
            "fp16": choice.get("precision") == "fp16",
        }
        for name, on in wanted.items():
            box = self.toggles[name]
            box.value = on and not box.disabled
        how = "cached measurement" if result.cached else f"measured in {result.calibration_s:.0f} s"
        self.tune_note.value = (
            f"<small>fastest here: <b>{html.escape(result.chosen)}</b> ({how}); the toggles are set to it</small>"
            + _tune_table_html(result)
        )

    def show_availability(self, report: Any) -> None:
        """Take the doctor's `report` for the notes and toggles: an acceleration found unavailable is switched off
        (Launch then validates the spec again)."""
        self.report = report
        self.available = dict(report.accelerations)
        for name in ACCELS:
            a = self.available[name]
            self.notes[name].value = _note_html(a, True)
            box = self.toggles[name]
            box.disabled = not a.available
            if not a.available and box.value:
                box.value = False
        self.check_button.description = "check again"
        self.check_note.value = _checked_html(report)

    # --- the spec ------------------------------------------------------------------------------------------

    def _show_target(self) -> None:
        """Only the field of the chosen target is shown (the interpreter, or the cluster's address)."""
        self.python.layout.display = None if self.where.value == "other Python" else "none"
        self.cluster.layout.display = None if self.where.value == "cluster" else "none"
        here = "check again" if self.probed else "check this machine"
        self.check_button.description = "check the cluster" if self.where.value == "cluster" else here

    def _label_columns(self) -> None:
        """Name the two column fields for the chosen task, with the descriptions of the fields they edit."""
        first, second = COLUMN_LABELS.get(self.task.value, TEXT_LABEL_COLUMNS)
        self.text_column.description, self.label_column.description = first, second
        first_path, second_path = COLUMN_FIELDS.get(self.task.value, TEXT_LABEL_FIELDS)
        self.text_column.tooltip = self.fields.tip(first_path)
        self.label_column.tooltip = self.fields.tip(second_path)
        if hasattr(self, "chat_box"):
            self.chat_box.layout.display = None if self.task.value == "causal-lm" else "none"

    def spec_dict(self) -> dict[str, Any]:
        """The spec the widgets say: the starting spec, with each widget's value written to the field it edits
        (by path, converted as the field's schema wants: an empty optional text is None). The fields of the other
        tasks (columns, chat data) are cleared: a spec keeps only what its task reads."""
        t = self.toggles
        spec = {**self._base}
        seq2seq = self.task.value == "seq2seq"
        causal = self.task.value == "causal-lm"
        columns = COLUMN_FIELDS.get(self.task.value, TEXT_LABEL_FIELDS)
        values = {
            **{p: w.value for p, w in self.by_path.items() if p not in CHAT_FIELDS},
            columns[0]: self.text_column.value,
            columns[1]: self.label_column.value,
        }
        for other in {*TEXT_LABEL_FIELDS, *COLUMN_FIELDS["seq2seq"]} - set(columns):
            values[other] = None
        for path in CHAT_FIELDS:
            values[path] = self.by_path[path].value if causal else self.fields.field(path).default
        for path, value in values.items():
            set_path(spec, path, None if value is None else self.fields.value(path, value))
        if not seq2seq:  # a seq2seq start's generation settings do not follow into another task
            set_path(spec, "hyper.max_target_length", None)
            kept = ("prompts", "num_prompts", "score_examples", "max_new_tokens") if causal else ()
            spec["generation"] = {k: v for k, v in self._base["generation"].items() if k in kept}
        precision = "fp16" if t["fp16"].value else "bf16" if t["bf16"].value else "fp32"
        spec["accel"] = {
            **self._base["accel"],
            "ort": t["ort"].value,
            "fused_adam": t["fused_adam"].value,
            "zero_stage": 1 if t["zero1"].value else 0,
            "precision": precision,
            "torch_compile": t["torch_compile"].value,
        }
        set_path(spec, "adapter.kind", "lora" if self.lora.value else "none")
        spec["target"] = {"processes": self.processes.value}
        if self.where.value == "other Python":
            spec["target"]["python"] = self.python.value.strip() or None
        elif self.where.value == "cluster":
            spec["target"]["cluster"] = self.cluster.value.strip() or "local"
        if self.root:
            spec["output_dir"] = self.root
        return spec

    def spec(self):
        """The RunSpec that Launch would start (raises SpecError when its own rules are broken)."""
        from ortlab.spec import RunSpec

        return RunSpec.parse(self.spec_dict())

    def validate(self) -> bool:
        try:
            self.spec()
        except OrtlabError as e:
            self.launch_button.disabled = True
            self.show_error(e)
            return False
        self.launch_button.disabled = False
        self.problems.value = "<span style='color:#080'>ready to launch</span>"
        return True

    def show_error(self, e: OrtlabError) -> None:
        """An OrtlabError in the message area under Launch: its problems one per line (a spec's), else its
        message; escaped, as it may quote a spec, a path or a run folder."""
        problems = getattr(e, "problems", None) or [line.strip() for line in str(e).splitlines() if line.strip()]
        items = "".join(f"<li>{html.escape(str(p))}</li>" for p in problems)
        self.problems.value = f"<span style='color:#b00'>cannot launch:</span><ul>{items}</ul>"

    # --- pickers -------------------------------------------------------------------------------------------

    def search_models(self) -> None:
        from ortlab.discover import search_models

        hits, note = search_models(self.model.value if "/" not in self.model.value else "")
        self.model.options = [h.id for h in hits]
        lines = []
        for h in hits[:10]:
            size = f", {h.size_mb:.0f} MB" if h.size_mb else ""
            params = f", {h.parameters / 1e6:.1f}M parameters" if h.parameters else ""
            lines.append(f"{html.escape(h.id)} <small>({html.escape(h.where)}{size}{params})</small>")
        self.model_info.value = "<br>".join(lines) + (f"<br><small>{html.escape(note)}</small>" if note else "")

    def inspect_data(self) -> None:
        from ortlab.discover import inspect_dataset

        try:
            info = inspect_dataset(self.data.value.strip())
        except OrtlabError as e:  # data that cannot be used, an asset not installed, the Hub offline
            self.data_preview.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"
            return
        p = info.proposal
        self.task.value = p["task"] or self.task.value
        seq2seq = p["task"] == "seq2seq"
        self.text_column.value = (p["source_column"] if seq2seq else p["text_column"]) or ""
        self.label_column.value = (p["target_column"] if seq2seq else p["label_column"]) or ""
        for field in ("messages_column", "prompt_column", "response_column"):
            getattr(self, field).value = p.get(field) or ""
        preview = [{k: str(v)[:80] for k, v in row.items()} for row in info.rows]
        labels = f", labels: {', '.join(map(str, info.label_names[:12]))}" if info.label_names else ""
        # Split, column and label names come from the data: escaped, like every value in the preview table.
        self.data_preview.value = (
            f"<small>{html.escape(f'splits {info.splits}; columns {info.columns}{labels}; proposed task ')}"
            f"<b>{html.escape(str(p['task']))}</b></small>" + table_html(preview)
        )

    # --- runs ----------------------------------------------------------------------------------------------

    def launch(self):
        """Start the current spec in its own process; its charts appear below. The spec's own rules are checked as
        it is edited (`validate`); what its target can run is checked here, once, by the launch itself."""
        from ortlab.runner import launch

        if not self.validate():
            return None
        try:
            run = launch(self.spec())
        except OrtlabError as e:  # what the spec alone cannot tell (the mix here, another Python): said, not raised
            self.show_error(e)
            return None
        self._track(run)
        return run

    def stop(self) -> None:
        """Stop the selected run gracefully (in the background: the kernel stays free)."""
        run = self._runs.get(self.run_list.value)
        if run is not None:
            threading.Thread(target=run.stop, daemon=True).start()

    def reattach(self) -> None:
        """Find the runs under the runs folder; follow the running ones."""
        from ortlab.runner import runs

        for run in runs(self.root):
            self._track(run, follow=run.state in ("pending", "running"))

    def _track(self, run: Any, follow: bool = True) -> None:
        self._runs[run.id] = run
        self.monitor.add_run(run, follow=follow)
        ids = list(self._runs)
        self.run_list.options = ids
        self.run_list.value = run.id
        self.baseline.options = ids
        if self.baseline.value is None:
            self.baseline.value = ids[0]
        self.refresh_comparison()

    def _refresh_soon(self, final: bool = False) -> None:
        """Called by the monitor as points arrive: refresh the table at most every 2 s (it reads run folders),
        and always when a run ends."""
        if final or time.monotonic() - self._last_refresh > 2.0:
            self.refresh_comparison()

    def refresh_comparison(self) -> None:
        self._last_refresh = time.monotonic()
        if self._runs:
            # From the summaries the live charts fold as they draw: no run's metrics file is read again here.
            runs = list(self._runs.values())
            self.comparison.value = table_html(
                rows(runs, baseline=self.baseline.value, summaries=self.monitor.summaries)
            )
        self.refresh_generations()

    def refresh_generations(self) -> None:
        """Show the latest generations of the selected run (escaped: model output is hostile)."""
        from ortlab.chat import read_generations

        run = self._runs.get(self.run_list.value)
        self.generations.value = "" if run is None else generations_html(read_generations(run.dir.path), run.id)

    # --- where widgets cannot render -------------------------------------------------------------------------

    def _shown_runs(self) -> list[Any]:
        return list(self._runs.values())

    def _summary(self) -> tuple[str, str]:
        summary_html, text = static_summary(
            list(self._runs.values()), title="ortlab workbench", summaries=self.monitor.summaries
        )
        summary_html += self.generations.value
        try:
            spec_text = self.spec().to_yaml()
        except Exception as e:  # an invalid spec is still worth showing, with why
            spec_text = f"invalid spec: {e}"
        # Folded: the spec is 50 lines of YAML, and a reader of a saved notebook looks at the runs first.
        spec_html = f"<details><summary>the spec (YAML)</summary><pre>{html.escape(spec_text)}</pre></details>"
        return summary_html + spec_html, text + "\n" + spec_text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/html"], bundle["text/plain"] = self._summary()
        return bundle

    def __repr__(self) -> str:
        return self._summary()[1]
