"""`ortlab.Workbench()`: pick a model, data and an acceleration mix, launch and stop runs, watch and compare.

The widgets only edit a RunSpec: `workbench.spec()` is what Launch would start, and every change is validated
with the same RunSpec rules as the CLI (Launch stays disabled, with the reason shown, while the spec is
invalid). Runs are launched with `ortlab.launch` and watched through their run folders, so a workbench opened
again (in the same or a new kernel) finds its runs and re-attaches to the running ones.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from ortlab.spec import RunSpec
from ortlab.ui.estimatenote import EstimateNote
from ortlab.ui.form import SpecForm
from ortlab.ui.mixpanel import MixPanel
from ortlab.ui.runs_panel import RunsPanel


class Workbench(SpecForm, MixPanel, RunsPanel, EstimateNote, widgets.VBox):
    """The ortlab workbench. `Workbench(spec={...})` starts from a spec (a dict or RunSpec) instead of the
    embedded default; `root` is the runs folder (default ./ortlab-runs).

    Its parts are mixins over one set of widgets: the form (`ortlab.ui.form`), the acceleration mix
    (`ortlab.ui.mixpanel`), the runs (`ortlab.ui.runs_panel`) and the estimate beside Launch
    (`ortlab.ui.estimatenote`); this class lays them out and wires their events."""

    def __init__(self, spec: Any = None, root: str | None = None, **kwargs: Any):

        self.root = root
        start = spec if isinstance(spec, RunSpec) else RunSpec.parse(spec or {})
        self._form_widgets(start)
        accel_rows = self._mix_widgets(start)
        self._runs_widgets()
        self._estimate_widgets()

        form = widgets.VBox(
            [
                widgets.HTML("<h3>ortlab workbench</h3>"),
                widgets.HBox([self.model, self.model_search]),
                self.model_info,
                widgets.HBox([self.data, self.data_inspect]),
                self.data_preview,
                widgets.HBox([self.task, self.text_column, self.label_column]),
                self.chat_box,
                self.preference_box,
                # (the heading and button keep their width: ipywidgets 7 shrank both beside a long note, #43)
                widgets.HBox(
                    [
                        widgets.HTML("<b>acceleration mix</b>", layout=widgets.Layout(flex="0 0 auto")),
                        self.check_button,
                        self.check_note,
                    ]
                ),
                *accel_rows,
                widgets.HBox([self.tune_button, self.tune_note]),
                widgets.HTML("<b>training</b>"),
                widgets.HBox([self.learning_rate, self.epochs, self.max_steps]),
                widgets.HBox([self.batch_size, self.max_length, self.max_train_samples]),
                widgets.HBox([self.budget_minutes, self.budget_memory_gb]),
                widgets.HBox([self.lora, self.adapter_rank, self.report_to]),
                widgets.HBox([self.processes, self.where, self.python, self.cluster, self.name]),
                widgets.HBox([self.storage, self.max_failures]),
                widgets.HBox([self.launch_button, self.stop_button, self.estimate_note]),
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
            self.storage,
            self.max_failures,
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

    def validate(self) -> bool:
        """The form's check (`SpecForm.validate`), then the estimate of a valid spec beside Launch."""
        ok = SpecForm.validate(self)
        if ok:
            self.refresh_estimate(self.spec())
        else:
            self.clear_estimate()
        return ok
