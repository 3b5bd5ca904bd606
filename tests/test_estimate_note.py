"""The estimate beside the workbench's Launch button follows the form: a bigger batch predicts more memory, an
invalid spec shows none, a spec beyond this machine says it does not fit, and what it shows is escaped."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("ipywidgets")


def _settled(wb, before: str = "", timeout: float = 30.0) -> str:
    """The note once the debounced estimate has answered (and differs from `before`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = wb.estimate_note.value
        if value and value != before:
            return value
        time.sleep(0.05)
    raise AssertionError(f"the estimate note still says {wb.estimate_note.value!r}")


def _peak_mib(note: str) -> float:
    value, unit = re.search(r"peak memory ≈ ([\d.]+) (MiB|GiB)", note).groups()
    return float(value) * (1024 if unit == "GiB" else 1)


@pytest.fixture
def workbench(tmp_path):
    from ortlab.ui import Workbench

    wb = Workbench(spec={"hyper": {"max_steps": 20, "batch_size": 4, "max_length": 64}}, root=str(tmp_path))
    yield wb
    wb.monitor.close()


def test_the_note_follows_the_form(workbench):
    from ortlab.estimator import estimate

    first = _settled(workbench)
    assert "s/step" in first and "in all" in first and "available" in first, first
    predicted = estimate(workbench.spec()).peak.value
    assert _peak_mib(first) == pytest.approx(predicted, rel=0.06), "the note shows ortlab.estimate's peak"

    workbench.batch_size.value = 64
    workbench.max_length.value = 256
    bigger = _settled(workbench, first)
    assert _peak_mib(bigger) > _peak_mib(first), (first, bigger)

    workbench.learning_rate.value = -1.0  # invalid: Launch is disabled and no estimate stands beside it
    assert workbench.launch_button.disabled
    assert workbench.estimate_note.value == ""


def test_a_spec_beyond_this_machine_says_it_does_not_fit(workbench, monkeypatch):
    from ortlab.ui import estimatenote

    class Huge:  # what estimate() answers for a spec far beyond the machine (names escaped on the way)
        peak = type("T", (), {"value": 4e6, "low": 3e6, "high": 5e6})()
        step = type("T", (), {"value": 2.0})()
        total = None
        available_mb = 20_000.0
        fits = False
        biggest = type("T", (), {"name": "<activations>", "value": 3.5e6})()

    # (the estimate the note shows comes through `estimator.budget.as_launched`, as the server's route's does)
    monkeypatch.setattr("ortlab.estimator.budget.estimate", lambda spec, **_: Huge())
    workbench.batch_size.value = 8
    note = _settled(workbench, workbench.estimate_note.value)
    assert "does not fit" in note and "&lt;activations&gt;" in note and "<activations>" not in note
    assert "3906.2 GiB" in note, "sizes in GiB where they are large"
    assert estimatenote.estimate_html(Huge()).startswith("<span style='color:#b00'>")


def test_an_estimate_that_fails_says_why_and_leaves_launch_alone(workbench, monkeypatch):
    def broken(spec, **_):
        raise ValueError("no config.json <here>")

    monkeypatch.setattr("ortlab.estimator.budget.estimate", broken)
    workbench.batch_size.value = 16
    note = _settled(workbench, workbench.estimate_note.value)
    assert note == "<small>no estimate: no config.json &lt;here&gt;</small>"
    assert not workbench.launch_button.disabled


def test_a_budget_in_the_form_shows_what_launch_would_change(workbench, monkeypatch):
    from ortlab.estimator import calibration, estimate

    # This machine's calibration as it is now, for the test's estimate and the note's alike: a run in another
    # worker may teach the same key meanwhile, and then "five of the 20 steps" would be another number.
    entries = calibration.load()
    monkeypatch.setattr(calibration, "load", lambda: entries)
    first = _settled(workbench)
    est = estimate(workbench.spec())
    minutes = (est.total.value - 20 * est.step.value + 5 * est.step.value) / 60  # five of the 20 steps fit
    workbench.budget_minutes.value = round(minutes, 4)
    note = _settled(workbench, first)
    assert workbench.spec().budget.minutes == pytest.approx(minutes, abs=1e-4)
    assert "budget: max_steps" in note and "in all" in note, note
    workbench.budget_minutes.value = 0.0001  # no step fits: the note says so, with the closest budget
    assert "closest budget" in _settled(workbench, note)
    workbench.budget_minutes.value = 0  # 0 is no budget
    assert workbench.spec().budget.minutes is None
