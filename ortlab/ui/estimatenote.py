"""The estimate beside Launch: predicted peak memory, time per step and for the whole run, for the spec the form
says now (`ortlab.estimate`: config.json, the safetensors header and a data sample; no model loaded).

It follows the form as it changes, but off the kernel's thread and a moment after the last change (a user typing
a batch size should not start one estimate per keystroke, and the kernel must stay free). An older estimate that
finishes after a newer one was asked for is dropped. A spec that cannot fit this machine says so in red with the
biggest term; Launch itself refuses it too (`ortlab.runner.preflight`), with the remedies."""

from __future__ import annotations

import html
import threading
from typing import Any

import ipywidgets as widgets

DEBOUNCE_S = 0.4  # after the last change, before estimating


def _mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_of(spec: Any) -> tuple[Any, list[str]]:
    """The estimate Launch would start from: of the spec fitted to its budget when it has one, with what the fit
    would change (`ortlab.estimator.budget.as_launched`, as the server's route answers); else of the spec as it is. A
    budget that cannot be met raises its error (the note says it)."""
    from ortlab.estimator.budget import as_launched

    launched = as_launched(spec)
    return launched.estimate, launched.choices


def estimate_html(est: Any, fitted: list[str] | None = None) -> str:
    """One line for the form: peak memory (of what is available), step time and whole run, each with its range;
    with a budget, what Launch would change to fit it."""
    peak = est.peak
    memory = f"peak memory ≈ {_mib(peak.value)} ({_mib(peak.low)}–{_mib(peak.high)})"
    if est.available_mb is not None:
        memory += f" of {_mib(est.available_mb)} available"
    parts = [memory, f"≈ {est.step.value:.2g} s/step"]
    if est.total is not None:
        parts.append(f"≈ {_duration(est.total.value)} in all ({_duration(est.total.low)}–{_duration(est.total.high)})")
    if fitted:
        parts.append("budget: " + "; ".join(fitted))
    line = html.escape(" · ".join(parts))
    if est.fits is False:
        biggest = est.biggest
        why = f"does not fit: biggest term {biggest.name} ≈ {_mib(biggest.value)}"
        return f"<span style='color:#b00'><b>{html.escape(why)}</b> · {line}</span>"
    return f"<small>{line}</small>"


class EstimateNote:
    """Mixin of the workbench: `estimate_note` (an HTML widget) and `refresh_estimate(spec)`."""

    estimate_note: widgets.HTML

    def _estimate_widgets(self) -> None:
        self.estimate_note = widgets.HTML("")
        self.estimate_note.add_class("ortlab-estimate")
        self._estimate_asked = 0
        self._estimate_timer: threading.Timer | None = None

    def refresh_estimate(self, spec: Any) -> threading.Timer:
        """Estimate `spec` (a RunSpec) in the background, DEBOUNCE_S after the last call; the note shows it."""
        self._estimate_asked += 1
        asked = self._estimate_asked
        if self._estimate_timer is not None:
            self._estimate_timer.cancel()

        def work() -> None:
            try:
                text = estimate_html(*estimate_of(spec))
            except Exception as e:  # an estimate never stands in Launch's way: it says why it has none
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                text = f"<small>no estimate: {html.escape(why)}</small>"
            if asked == self._estimate_asked:  # a newer spec was asked for meanwhile: its answer will show
                self.estimate_note.value = text

        timer = threading.Timer(DEBOUNCE_S, work)
        timer.daemon = True
        timer.start()
        self._estimate_timer = timer
        return timer

    def clear_estimate(self) -> None:
        self._estimate_asked += 1
        if self._estimate_timer is not None:
            self._estimate_timer.cancel()
        self.estimate_note.value = ""
