"""The workbench's acceleration mix: a toggle per acceleration with what this runtime says of it (the doctor's
cached report when there is one, else the static checks), "check this machine" (the doctor, in the background,
then the toggles follow what it found) and "measure the fastest" (`ortlab tune` in its own process, then the
toggles are set to its choice)."""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from ortlab.accel import NOT_PROBED, availability_of
from ortlab.accel.mix import resolve
from ortlab.toggles import TUNED_FIELDS, exclusive_with, form_toggles
from ortlab.tune import TuneResult
from ortlab.ui.form import TOOLTIP

# What "measure the fastest" sets: the fields a measurement decides (`TUNED_FIELDS`, the toggles that are `tuned`). Its
# choice also says torch_compile, but a compiled mix runs in its own runtime, which the form's target does not follow:
# that toggle, ZeRO's and the others stay as they were.


def _availability() -> tuple[dict[str, Any], Any]:
    """What this runtime can run, and the doctor's report it comes from: its cached report when this environment
    was probed before (`ortlab doctor`; instant), else the static checks (instant too; report None). The workbench
    never waits for probes on opening: they take 10-40 s, and most workbenches (every test's included) never need
    them. The "check this machine" button runs them on request, in the background."""
    from ortlab.probe import cached_report

    report = cached_report()
    if report is not None:
        return dict(report.accelerations), report

    return {t.name: availability_of(t) for t in form_toggles()}, None


def _note_html(a: Any, probed: bool) -> str:
    """One toggle's note. Unprobed, an available acceleration is only "installed" (its versions and files are
    right; nothing was tried), and the "(not probed)" of each reason is said once, above the toggles, instead."""

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


def _untick(change: dict[str, Any], others: list[widgets.Checkbox]) -> None:
    """A toggle ticked unticks the others that set the same spec field."""
    if change["new"]:
        for box in others:
            box.value = False


def _small(text: str) -> str:
    return f"<small>{html.escape(text)}</small>"


def _run_tune(spec: Any, progress: Any) -> Any:
    """`python -m ortlab.cli tune SPEC --json`: its progress lines (stderr) to `progress`, its result parsed."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from ortlab.envvars import child_cwd, child_env

    with tempfile.TemporaryDirectory(prefix="ortlab-tune-spec-") as tmp:
        path = Path(tmp) / "spec.json"
        # The tune runs in ortlab's folder with a safe path (nothing imported from the notebook's folder): the
        # spec's relative paths are named in full first, from the kernel's folder, where they were written.
        path.write_text(spec.anchored(os.getcwd()).to_json())
        proc = subprocess.Popen(
            [sys.executable, "-m", "ortlab.cli", "tune", str(path), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=child_env(),
            cwd=child_cwd(),
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


class MixPanel:
    """The mix part of the `Workbench` (a mixin over the workbench's widgets: `spec()` and `where` are the form's)."""

    def _mix_widgets(self, start: Any) -> list[widgets.HBox]:
        """The toggles, set to `start`'s mix as far as this runtime can run it, each with its note; the check and
        tune buttons. Returns the toggles' rows, for the form's layout."""
        self.available, self.report = _availability()
        self.notes: dict[str, widgets.HTML] = {}

        resolved = resolve(start.accel)  # 'auto' as this machine would run it, without measuring
        self.toggles: dict[str, widgets.Checkbox] = {}
        accel_rows = []
        for t in form_toggles():
            a = self.available[t.name]
            box = widgets.Checkbox(
                value=t.is_on(getattr(resolved, t.field)) and a.available,
                description=t.label,
                indent=False,
                disabled=not a.available,
                **{TOOLTIP: self.fields.tip(t.path)},
                layout=widgets.Layout(width="200px"),
            )
            self.toggles[t.name] = box
            self.notes[t.name] = widgets.HTML(_note_html(a, self.probed))
            accel_rows.append(widgets.HBox([box, self.notes[t.name]]))
        for t in form_toggles():  # toggles of one field exclude each other (fp16 and bf16: one precision)
            others = [self.toggles[name] for name in exclusive_with(t.name)]
            self.toggles[t.name].observe(lambda change, others=others: _untick(change, others), names="value")

        self.check_button = widgets.Button(
            description="check again" if self.probed else "check this machine",
            tooltip="try each acceleration for real (10-40 s, in the background)",
            # flex: not shrunk beside a long note (ipywidgets 7 cut the label to "check this …" in the classic notebook)
            layout=widgets.Layout(width="max-content", flex="0 0 auto"),
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
        return accel_rows

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
            from ortlab.probe import DoctorReport, doctor, progress_to

            def said(line: str) -> None:  # the probes' progress, beside the button
                self.check_note.value = _small(line.strip())

            try:
                if self.where.value == "cluster":  # the cluster's own doctor, run there as a short job
                    from ortlab.runner import target_doctor

                    report = DoctorReport.from_dict(target_doctor(self.spec()))
                else:
                    with progress_to(said):
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
        for t in form_toggles():
            if t.field in TUNED_FIELDS:
                box = self.toggles[t.name]
                box.value = t.is_on(choice.get(t.field)) and not box.disabled
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
        for name, box in self.toggles.items():
            a = self.available[name]
            self.notes[name].value = _note_html(a, True)
            box.disabled = not a.available
            if not a.available and box.value:
                box.value = False
        self.check_button.description = "check again"
        self.check_note.value = _checked_html(report)
