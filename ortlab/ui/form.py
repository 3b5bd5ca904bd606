"""The workbench's form: the widgets that edit a RunSpec, each bound by path to the spec field it edits (its
value from the starting spec, its tooltip the field's description in RunSpec's schema), the spec they say, checked
by RunSpec's own rules on every change, and the pickers that fill the form (search models, inspect data)."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from ortlab.discover import inspect_dataset, search_models
from ortlab.errors import OrtlabError
from ortlab.spec import TRACKERS, RunSpec
from ortlab.specfields import SpecFields, get_path, set_path
from ortlab.tasks import get_task
from ortlab.toggles import field_values
from ortlab.ui.summary import table_html

WIDE = widgets.Layout(width="420px")
# A field's hover text: ipywidgets 8 calls it `tooltip`; 7 (Colab's 7.7.1) `description_tooltip`, and takes a
# `tooltip` keyword without a word and without showing it.
TOOLTIP = "tooltip" if int(widgets.__version__.split(".")[0]) >= 8 else "description_tooltip"
# Labels such as "learning rate" are wider than ipywidgets' default label column: size it to fit them whole.
LABEL = {"description_width": "100px"}
# The two column fields: a text and its label, or (a task with a target: seq2seq) a source and the target text to
# produce from it; a task that finds its columns itself (preference) shows neither.
TEXT_LABEL_COLUMNS = ("text col", "label col")
SOURCE_TARGET_COLUMNS = ("source col", "target col")
TEXT_LABEL_FIELDS = ("data.text_column", "data.label_column")
SOURCE_TARGET_FIELDS = ("data.source_column", "data.target_column")
# chat data (a task that takes it: causal-lm): a messages column, or a prompt and a response column (TRL's
# formats), and packing.
CHAT_FIELDS = ("data.messages_column", "data.prompt_column", "data.response_column", "data.packing")
# task preference: the loss and its settings
PREFERENCE_FIELDS = ("preference.loss", "preference.beta", "preference.reference")


def column_fields(task: str) -> tuple[str, ...]:
    """The two column fields the task's record reads (`ortlab.tasks.Task.columns`), or () when it finds its own."""
    record = get_task(task)
    if record.target:
        return SOURCE_TARGET_FIELDS
    return TEXT_LABEL_FIELDS if "text_column" in record.columns else ()


class SpecForm:
    """The form part of the `Workbench` (a mixin over the workbench's widgets: Launch and its message area are the
    runs panel's, the acceleration toggles the mix's)."""

    def _form_widgets(self, start: Any) -> None:
        """The fields that edit `start` (a RunSpec): model, data and its columns, training, adapter, trackers and
        where the run goes."""

        self._base = start.model_dump(mode="json")
        # The fields' choices and descriptions (the tooltips) come from RunSpec's schema, not from copies here.
        self.fields = SpecFields()
        # The widgets that edit one spec field each, by the field's path: `spec_dict` writes them back by path.
        self.by_path: dict[str, widgets.ValueWidget] = {}

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
        first, second = column_fields(start.task) or TEXT_LABEL_FIELDS
        self.text_column = widgets.Text(value=get_path(self._base, first) or "", placeholder="auto")
        self.label_column = widgets.Text(value=get_path(self._base, second) or "", placeholder="auto")
        self.messages_column, self.prompt_column, self.response_column = (
            self._field(widgets.Text, f"data.{what}_column", placeholder="auto", description=what)
            for what in ("messages", "prompt", "response")
        )
        self.packing = self._field(widgets.Checkbox, "data.packing", description="packing", indent=False)
        self.chat_box = widgets.HBox([self.messages_column, self.prompt_column, self.response_column, self.packing])
        self.preference_box = widgets.HBox(
            [
                self._field(
                    widgets.Dropdown,
                    "preference.loss",
                    options=self.fields.choices("preference.loss"),
                    description="loss",
                ),
                self._field(widgets.FloatText, "preference.beta", description="beta"),
                self._field(
                    widgets.Dropdown,
                    "preference.reference",
                    options=self.fields.choices("preference.reference"),
                    description="reference",
                ),
            ]
        )
        self._label_columns()

        # hyperparameters and target
        self.learning_rate = self._field(widgets.FloatText, "hyper.learning_rate", description="learning rate")
        self.epochs = self._field(widgets.FloatText, "hyper.epochs", description="epochs")
        self.max_steps = self._field(widgets.IntText, "hyper.max_steps", description="max steps")
        self.batch_size = self._field(widgets.IntText, "hyper.batch_size", description="batch size")
        self.max_length = self._field(widgets.IntText, "hyper.max_length", description="max length")
        self.max_train_samples = self._field(widgets.IntText, "data.max_train_samples", description="train rows")
        self.budget_minutes = self._field(widgets.FloatText, "budget.minutes", description="budget, min")
        self.budget_memory_gb = self._field(widgets.FloatText, "budget.memory_gb", description="budget, GB")
        # what trains (every weight, or a LoRA adapter) and where the metrics also go
        self.lora = widgets.Checkbox(
            value=start.adapter.kind == "lora",
            description="LoRA adapter",
            indent=False,
            **{TOOLTIP: self.fields.tip("adapter.kind")},
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
            **{TOOLTIP: self.fields.tip("target.python")},
        )
        # Where the run goes: this machine, another Python here, or a Ray cluster (its address, or 'local').
        where = "cluster" if start.target.cluster else "other Python" if start.target.python else "local"
        self.where = widgets.Dropdown(options=["local", "other Python", "cluster"], value=where, description="where")
        self.cluster = widgets.Text(
            value=start.target.cluster or "",
            description="cluster",
            placeholder="local or http://HOST:8265",
            **{TOOLTIP: self.fields.tip("target.cluster")},
        )
        # A cluster run's storage (default: the local head's folder) and how often Ray Train may restart its workers.
        self.storage = widgets.Text(
            value=start.target.storage or "",
            description="storage",
            placeholder="the head's own folder",
            **{TOOLTIP: self.fields.tip("target.storage")},
        )
        self.max_failures = widgets.BoundedIntText(
            value=start.target.max_failures,
            min=0,
            max=100,
            description="max failures",
            **{TOOLTIP: self.fields.tip("target.max_failures")},
            style=LABEL,
        )
        self.name = self._field(widgets.Text, "name", description="run name", placeholder="automatic")

    def _field(self, cls: type, path: str, **kw: Any) -> Any:
        """A widget that edits the spec field at `path`: it starts at the starting spec's value (the spec's
        default unless given), its tooltip is the field's description from RunSpec's schema, and `spec_dict`
        reads it back by the same path."""
        value = get_path(self._base, path)
        if value is None:  # an unset optional field: an empty text, or 0 for a number (its tooltip says so)
            value = 0 if issubclass(cls, (widgets.IntText, widgets.FloatText)) else ""
        if isinstance(value, list):
            value = tuple(value)
        kw.setdefault(TOOLTIP, self.fields.tip(path))
        if issubclass(cls, (widgets.IntText, widgets.FloatText)):
            kw.setdefault("style", LABEL)
        w = cls(value=value, **kw)
        self.by_path[path] = w
        return w

    # --- the spec ------------------------------------------------------------------------------------------

    def _show_target(self) -> None:
        """Only the field of the chosen target is shown (the interpreter, or the cluster's address)."""
        self.python.layout.display = None if self.where.value == "other Python" else "none"
        on_cluster = self.where.value == "cluster"
        self.cluster.layout.display = None if on_cluster else "none"
        self.storage.layout.display = self.max_failures.layout.display = None if on_cluster else "none"
        self.processes.description = "workers" if on_cluster else "processes"
        here = "check again" if self.probed else "check this machine"
        self.check_button.description = "check the cluster" if self.where.value == "cluster" else here

    def _label_columns(self) -> None:
        """Name the two column fields for the chosen task, with the descriptions of the fields they edit."""
        record, columns = get_task(self.task.value), column_fields(self.task.value)
        first, second = SOURCE_TARGET_COLUMNS if record.target else TEXT_LABEL_COLUMNS
        self.text_column.description, self.label_column.description = first, second
        first_path, second_path = columns or TEXT_LABEL_FIELDS
        setattr(self.text_column, TOOLTIP, self.fields.tip(first_path))
        setattr(self.label_column, TOOLTIP, self.fields.tip(second_path))
        self.text_column.layout.display = self.label_column.layout.display = None if columns else "none"
        self.chat_box.layout.display = None if record.chat else "none"
        self.preference_box.layout.display = None if record.pairs else "none"

    def spec_dict(self) -> dict[str, Any]:
        """The spec the widgets say: the starting spec, with each widget's value written to the field it edits
        (by path, converted as the field's schema wants: an empty optional text is None). The fields of the other
        tasks (columns, chat data) are cleared: a spec keeps only what its task reads."""
        spec = {**self._base}
        record, columns = get_task(self.task.value), column_fields(self.task.value)
        own = {*CHAT_FIELDS, *PREFERENCE_FIELDS}
        values = {
            **{p: w.value for p, w in self.by_path.items() if p not in own},
            **dict(zip(columns, (self.text_column.value, self.label_column.value), strict=False)),
        }
        for other in {*TEXT_LABEL_FIELDS, *SOURCE_TARGET_FIELDS} - set(columns):
            values[other] = None
        for fields, used in ((CHAT_FIELDS, record.chat), (PREFERENCE_FIELDS, record.pairs)):
            for path in fields:
                values[path] = self.by_path[path].value if used else self.fields.field(path).default
        for path, value in values.items():
            set_path(spec, path, None if value is None else self.fields.value(path, value))
        if not record.generates:  # a seq2seq start's generation settings do not follow into another task
            set_path(spec, "hyper.max_target_length", None)
            kept = ("prompts", "num_prompts", "score_examples", "max_new_tokens") if record.answers_prompts else ()
            spec["generation"] = {k: v for k, v in self._base["generation"].items() if k in kept}
        # The fields the acceleration toggles set (`ortlab.toggles`); the other accel fields keep the start's values.
        for path, value in field_values(name for name, box in self.toggles.items() if box.value).items():
            set_path(spec, path, value)
        set_path(spec, "adapter.kind", "lora" if self.lora.value else "none")
        spec["target"] = {"processes": self.processes.value}
        if self.where.value == "other Python":
            spec["target"]["python"] = self.python.value.strip() or None
        elif self.where.value == "cluster":
            spec["target"]["cluster"] = self.cluster.value.strip() or "local"
            spec["target"]["storage"] = self.storage.value.strip() or None
            spec["target"]["max_failures"] = self.max_failures.value
        if self.root:
            spec["output_dir"] = self.root
        return spec

    def spec(self):
        """The RunSpec that Launch would start (raises SpecError when its own rules are broken)."""

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

        hits, note = search_models(self.model.value if "/" not in self.model.value else "")
        self.model.options = [h.id for h in hits]
        lines = []
        for h in hits[:10]:
            size = f", {h.size_mb:.0f} MB" if h.size_mb else ""
            params = f", {h.parameters / 1e6:.1f}M parameters" if h.parameters else ""
            lines.append(f"{html.escape(h.id)} <small>({html.escape(h.where)}{size}{params})</small>")
        self.model_info.value = "<br>".join(lines) + (f"<br><small>{html.escape(note)}</small>" if note else "")

    def inspect_data(self) -> None:

        try:
            info = inspect_dataset(self.data.value.strip())
        except OrtlabError as e:  # data that cannot be used, an asset not installed, the Hub offline
            self.data_preview.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"
            return
        p = info.proposal
        self.task.value = p["task"] or self.task.value
        seq2seq = get_task(self.task.value).target
        self.text_column.value = (p["source_column"] if seq2seq else p["text_column"]) or ""
        self.label_column.value = (p["target_column"] if seq2seq else p["label_column"]) or ""
        for field in ("messages_column", "prompt_column", "response_column"):
            getattr(self, field).value = p.get(field) or ""
        preview = [{k: str(v)[:80] for k, v in row.items()} for row in info.rows]
        labels = f", labels: {', '.join(map(str, info.label_names[:12]))}" if info.label_names else ""
        # Split, column and label names come from the data: escaped, like every value in the preview table.
        splits = {k: "size unknown" if v is None else v for k, v in info.splits.items()}
        note = f"<br><small>{html.escape(info.note)}</small>" if info.note else ""  # a large source: a head read
        self.data_preview.value = (
            f"<small>{html.escape(f'splits {splits}; columns {info.columns}{labels}; proposed task ')}"
            f"<b>{html.escape(str(p['task']))}</b></small>{note}" + table_html(preview)
        )
