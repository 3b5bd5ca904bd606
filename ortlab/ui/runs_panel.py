"""The workbench's runs: Launch and Stop, the runs list (the runs under the runs folder, found again when a
workbench opens), the comparison against a baseline, the selected run's generations, the live charts; and the
static summary that stands in for the widgets wherever they cannot render (a saved notebook, its HTML)."""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from ortlab.chat import read_generations
from ortlab.errors import OrtlabError
from ortlab.probe import progress_to
from ortlab.runner import launch, runs
from ortlab.ui.charts import RunMonitor
from ortlab.ui.display import RefreshedDisplay
from ortlab.ui.form import WIDE
from ortlab.ui.summary import generations_html, rows, static_summary, table_html


class RunsPanel(RefreshedDisplay):
    """The runs part of the `Workbench` (a mixin over the workbench's widgets: `spec()` and `validate()` are the
    form's). As a `RefreshedDisplay`, its saved output follows its runs' states."""

    def _runs_widgets(self) -> None:
        """Launch, Stop, the message area, the runs list, the baseline, the comparison and the live charts."""
        self._runs: dict[str, Any] = {}
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

    # --- runs ----------------------------------------------------------------------------------------------

    def launch(self):
        """Start the current spec in its own process; its charts appear below. The spec's own rules are checked as
        it is edited (`validate`); what its target can run is checked here, once, by the launch itself."""

        if not self.validate():
            return None
        said: list[str] = []

        def progress(line: str) -> None:  # a first launch in this environment probes it once: shown as it goes
            said.append(html.escape(line))
            self.problems.value = f"<small>launching: {'<br>'.join(said[-6:])}</small>"

        try:
            with progress_to(progress):
                run = launch(self.spec())
        except OrtlabError as e:  # what the spec alone cannot tell (the mix here, another Python): said, not raised
            self.show_error(e)
            return None
        self.problems.value = f"<span style='color:#080'>launched {html.escape(run.id)}</span>"
        self._track(run)
        return run

    def stop(self) -> None:
        """Stop the selected run gracefully (in the background: the kernel stays free)."""
        run = self._runs.get(self.run_list.value)
        if run is not None:
            threading.Thread(target=run.stop, daemon=True).start()

    def reattach(self) -> None:
        """Find the runs under the runs folder; follow the running ones."""

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
