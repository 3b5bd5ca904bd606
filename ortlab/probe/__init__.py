"""`ortlab doctor`: what this Python environment can run, each acceleration with its reason and remedy.

The probes are real (imports, and a tiny training step where that is the only way to know), each group in its own
subprocess (`ortlab.probe.groups`): a broken ORT build can crash the interpreter, and the notebook that asked must
survive that. The groups run in parallel, then the matmul peak alone; a cold doctor takes about as long as importing
onnxruntime-training once (~10 s on an idle 2-core CPU, 40 s on a busy one).

That is too slow to pay more than once, and the answer only changes when the environment does: every group's answer
is cached on its own, whatever its outcome (`ortlab.probe.cache`), so a warm `doctor()` reads files and runs no
probe, on any machine (issue #42: on a CPU without bf16 hardware a timed-out group kept the whole report out of the
cache, and every launch waited minutes for probes). A group that timed out or crashed is kept as such and tried
again after a back-off; `doctor(refresh=True)` (`ortlab doctor --refresh`) probes every group again now.

Who may wait for a probe:
- `ortlab doctor` and the workbench's "check this machine": they ask for it (`retry`: a failed group whose back-off
  has passed is probed again).
- the launch path (`ortlab.launch`, the CLI, the server, the workbench's Launch): `doctor(python, retry=False,
  peak=False, runtimes=...)`, what a launch needs and nothing more: cached answers, and only a group never probed in
  the environment the run goes to is probed, once, with its progress shown (`progress_to`, else on stderr).
- views that must open at once (the workbench, `ortlab info`, the server's API): `cached_report()`, never a probe.

`doctor(python=...)` probes another interpreter the same way, which is how ortlab checks a second runtime
(say, a newer torch for torch.compile) before launching a run there.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from ortlab import runtimes
from ortlab.accel import ACCELERATIONS, NOT_PROBED, Availability
from ortlab.probe import cache
from ortlab.probe.cache import PACKAGES, fingerprint, same_interpreter
from ortlab.probe.groups import ALL, GROUPS, PEAK, TIMEOUT_S, collect, start_probe
from ortlab.probe.report import DoctorReport, describe_peaks

__all__ = [
    "GROUPS",
    "PACKAGES",
    "DoctorReport",
    "cached_report",
    "describe_peaks",
    "doctor",
    "fingerprint",
    "progress_to",
]


def _stderr(message: str) -> None:
    print(f"[ortlab doctor] {message}", file=sys.stderr, flush=True)


_progress: ContextVar[Callable[[str], None] | None] = ContextVar("ortlab_doctor_progress", default=None)


@contextlib.contextmanager
def progress_to(callback: Callable[[str], None]) -> Iterator[None]:
    """Within the block (this thread), what a probing doctor says goes to `callback` instead of stderr: how a face
    shows it where the user looks (the workbench's message area) without every layer between passing it on."""
    token = _progress.set(callback)
    try:
        yield
    finally:
        _progress.reset(token)


@dataclass(frozen=True)
class _Ask:
    """What a caller lets the doctor probe."""

    refresh: bool = False  # every group again, now
    retry: bool = True  # a failed group whose back-off has passed
    peak: bool = True  # the matmul peak too (the launch path does without: a run measures its own)
    progress: Callable[[str], None] = _stderr

    def groups(self) -> tuple[str, ...]:
        return ALL if self.peak else tuple(GROUPS)

    def todo(self, answers: dict[str, cache.GroupAnswer | None], since: float | None = None) -> list[str]:
        """The groups to probe now; an answer probed at or after `since` (by another process, while this one waited
        for the lock) is taken as it is, even by a refresh."""
        now = time.time()
        todo = []
        for group in self.groups():
            a = answers.get(group)
            if a is not None and since is not None and a.probed_at >= since:
                continue
            if a is None or self.refresh or (self.retry and a.due(now)):
                todo.append(group)
        return todo


def doctor(
    python: str | None = None,
    refresh: bool = False,
    retry: bool = True,
    peak: bool = True,
    progress: Callable[[str], None] | None = None,
    runtimes: bool = True,
) -> DoctorReport:
    """Report what `python` (default: this interpreter) can run, from the cache where it has the answer.

    `refresh`: probe every group again now. `retry`: probe again a group that failed (timed out, crashed) once its
    back-off has passed; False on the launch path, which never waits for a probe that already failed. `peak`: the
    matmul peak too. `progress(message)`: what probing says as it goes (default: `progress_to`'s callback, else
    stderr); nothing is said when the cache has every answer. `runtimes`: probe ortlab's other runtimes too (when
    this interpreter is the one asked about); False shows their cached answers only (a launch that does not go
    there). Returns a `DoctorReport`; `ortlab doctor --json` prints `report.to_json()`.
    """
    started = time.monotonic()
    ask = _Ask(refresh, retry, peak, progress or _progress.get() or _stderr)
    here = python is None or same_interpreter(python)
    report = _doctor_one(python or sys.executable, ask)
    if here:
        _add_runtimes(report, ask if runtimes else None)
    report.elapsed_s = time.monotonic() - started
    return report


def cached_report(python: str | None = None) -> DoctorReport | None:
    """The cached report for this environment, or None while a group the launch needs was never probed (or the
    environment changed since). Never probes: for views that must open at once (the workbench, `ortlab info`) and
    can say "not probed yet" instead."""
    python = python or sys.executable
    report = _from_cache(python)
    if report is not None and same_interpreter(python):
        _add_runtimes(report, None)  # their cached reports, or their stamps: no probe
    return report


def _from_cache(python: str) -> DoctorReport | None:
    facts = fingerprint(python)
    answers = {g: cache.read(facts, g) for g in ALL}
    if any(answers[g] is None for g in GROUPS):
        return None
    return _assemble(python, facts, answers, probed=[])


def _doctor_one(python: str, ask: _Ask) -> DoctorReport:
    facts = fingerprint(python)
    answers = {g: cache.read(facts, g) for g in ALL}
    todo = ask.todo(answers)
    if todo:
        since = time.time()
        where = "" if same_interpreter(python) else f" ({python})"
        waited = []

        def waiting() -> None:
            waited.append(True)
            ask.progress(f"another process is probing this environment{where}; waiting for its answers ...")

        with cache.locked(facts, waiting):
            if waited:  # what the other process found counts: probe only what is still to do
                answers = {g: cache.read(facts, g) for g in ALL}
                todo = ask.todo(answers, since)
            if todo:
                answers.update(_probe(python, facts, todo, answers, ask.progress, where))
    return _assemble(python, facts, answers, probed=todo)


def _probe(
    python: str,
    facts: dict[str, Any],
    todo: list[str],
    before: dict[str, cache.GroupAnswer | None],
    progress: Callable[[str], None],
    where: str,
) -> dict[str, cache.GroupAnswer]:
    """Probe `todo`'s groups: the acceleration groups in parallel subprocesses, then the matmul peak alone. Each
    answer is cached as it comes, whatever its outcome."""
    progress(
        f"probing this environment{where}: {', '.join(todo)} (each in its own process, up to "
        f"{max(TIMEOUT_S[g] for g in todo):.0f} s; once, then cached) ..."
    )
    found: dict[str, cache.GroupAnswer] = {}

    def keep(group: str, result: dict[str, Any], t0: float) -> None:
        answer = cache.answered(group, result, time.monotonic() - t0, before.get(group))
        cache.write(facts, answer)
        found[group] = answer
        again = "" if answer.ok else f"; kept as such, tried again after {_clock(answer.retry_after)}"
        progress(f"  {group}: {answer.outcome} in {answer.seconds:.1f} s{again}")

    parallel = [g for g in todo if g != PEAK]
    t0 = time.monotonic()
    procs = {g: start_probe(python, g) for g in parallel}
    # One waiting thread a group: each answer is kept (and said) when its process ends, in the order they end.
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        waits = [pool.submit(collect, proc, g, t0 + TIMEOUT_S[g]) for g, proc in procs.items()]
        for done in as_completed(waits):
            group, result = done.result()
            keep(group, result, t0)
    if PEAK in todo:
        t1 = time.monotonic()
        keep(*collect(start_probe(python, PEAK), PEAK, t1 + TIMEOUT_S[PEAK]), t1)
    return found


def _assemble(
    python: str, facts: dict[str, Any], answers: dict[str, cache.GroupAnswer | None], probed: list[str]
) -> DoctorReport:
    """The report from the groups' answers (a group never answered: its accelerations "not probed yet")."""
    found: dict[str, Any] = {}
    notes = []
    for group, names in GROUPS.items():
        a = answers.get(group)
        if a is None:
            for n in names:
                found[n] = Availability(n, False, f"not probed yet{NOT_PROBED}", "run `ortlab doctor`").to_dict()
            continue
        found.update(a.result.get("accelerations", {}))
        if not a.ok:
            notes.append(_failed_note(a))
    torch_answer = answers.get("torch")
    env = torch_answer.result.get("environment", {}) if torch_answer is not None else {}
    if torch_answer is not None and torch_answer.ok and not env:
        notes.append("torch could not be imported in this environment: see the fused_adam row for the error")
    peak = answers.get(PEAK)
    peaks = peak.result.get("peaks", {}) if peak is not None and peak.ok else {}
    if peak is None:
        notes.append("the matmul peak is not measured yet: `ortlab doctor` measures it (a few seconds)")
    elif not peak.ok:
        notes.append(_failed_note(peak))
    kept = [a for a in answers.values() if a is not None]
    report = DoctorReport(
        python=facts.get("python", "unknown"),
        executable=python,
        platform=facts.get("platform", "unknown"),
        torch=env.get("torch"),
        cuda=env.get("cuda"),
        devices=env.get("devices", []),
        packages=facts.get("packages", {}),
        accelerations={n: Availability.from_dict(found[n]) for n in ACCELERATIONS},
        notes=notes,
        probed_at=max((a.probed_at for a in kept), default=None),
        cached=not probed,
        gpu=torch_answer.result.get("cuda", {}) if torch_answer is not None else {},
        peaks=peaks,
        groups={a.group: a.summary() for a in kept},
    )
    return report


def _failed_note(a: cache.GroupAnswer) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.probed_at))
    again = _clock(a.retry_after) if a.retry_after else "the next call"
    return (
        f"the {a.group} probe {a.outcome} ({when}, after {a.seconds:.0f} s): cached as such; `ortlab doctor` tries "
        f"it again after {again}, `ortlab doctor --refresh` now"
    )


def _add_runtimes(report: DoctorReport, ask: _Ask | None) -> None:
    """Probe ortlab's other runtimes (each through its own cached doctor) and say where torch_compile runs.

    In the ORT runtime (torch 2.6) torch.compile cannot run, but a launched run that asks for it goes to the
    compile runtime by itself (`ortlab.runner.local.Local.interpreter`): the doctor says so, instead of a bare "no".
    `ask` None: their cached answers only (no probe). Their matmul peak is not measured here: a run there measures
    its own (`ortlab.peak`), and the doctor shows this interpreter's.
    """

    for name in runtimes.RUNTIMES:
        state = runtimes.state_of(name)
        entry: dict[str, Any] = {
            "ready": state.python is not None,
            "path": str(state.path),
            "python": str(state.python) if state.python else None,
            "why": state.why,
        }
        if state.python is not None and not same_interpreter(str(state.python)):
            python = str(state.python)
            sub = _doctor_one(python, replace(ask, peak=False)) if ask is not None else _from_cache(python)
            if sub is not None:
                entry.update(torch=sub.torch, torch_compile=sub["torch_compile"].to_dict(), probed_at=sub.probed_at)
            else:  # not probed yet (cache-only callers): its stamp says torch imported with is_exporting
                torch = (state.stamp or {}).get("torch")
                entry.update(
                    torch=torch,
                    torch_compile=Availability(
                        "torch_compile", True, f"torch {torch} (not probed yet: `ortlab doctor`)", "nothing to do"
                    ).to_dict(),
                )
        elif state.python is not None:
            entry.update(torch=report.torch, torch_compile=report["torch_compile"].to_dict())
        report.runtimes[name] = entry
    here = report.accelerations["torch_compile"]
    compile_rt = report.runtimes.get("compile")
    if here.available or not here.details.get("needs_newer_torch") or compile_rt is None:
        return
    there = compile_rt.get("torch_compile") or {}
    if compile_rt["ready"] and there.get("available"):
        d = there.get("details", {})
        report.accelerations["torch_compile"] = Availability(
            "torch_compile",
            True,
            f"available in the compile runtime (torch {compile_rt['torch']}"
            + (f", Inductor on {d['device']}" if d.get("device") else "")
            + f"); this runtime's torch {here.details.get('torch')} cannot compile",
            "runs that ask for torch_compile are launched there by themselves (ortlab.launch, `ortlab train`); "
            "an ORTTrainer in this process cannot compile",
            details={**d, "runtime": "compile", "python": compile_rt["python"]},
        )
    elif compile_rt["ready"]:
        report.accelerations["torch_compile"] = Availability(
            "torch_compile",
            False,
            f"{here.reason}; the compile runtime cannot compile either: {there.get('reason', 'not probed')}",
            there.get("remedy") or "`ortlab doctor --refresh`",
            details={**here.details, "runtime": "compile"},
        )
    else:
        report.accelerations["torch_compile"] = Availability(
            "torch_compile", False, f"{here.reason}; {compile_rt['why']}", here.remedy, details=here.details
        )


def _clock(epoch: float | None) -> str:
    return time.strftime("%H:%M", time.localtime(epoch)) if epoch else "?"
