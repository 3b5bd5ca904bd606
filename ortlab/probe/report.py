"""The doctor's report: the environment, one `Availability` per acceleration, the measured peak, ortlab's other
runtimes, and where each probe group's answer came from (`groups`: probed when, in how long, with what outcome).
Plain data, read and written as JSON (the cache, `ortlab doctor --json`, the server's API); `render` is the table."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ortlab.accel import Availability
from ortlab.gpu import findings


@dataclass
class DoctorReport:
    """The doctor's findings: the environment, and one `Availability` per acceleration."""

    python: str
    executable: str
    platform: str
    torch: str | None
    cuda: str | None
    devices: list[dict[str, Any]]
    packages: dict[str, str | None]
    accelerations: dict[str, Availability]
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    probed_at: float | None = None  # when the probes ran (epoch seconds)
    cached: bool = False  # this report was read from the cache, not probed now
    # ortlab's other runtimes (`ortlab.runtimes`), each probed by its own (cached) doctor: only in the report of
    # the interpreter ortlab runs in, never cached with it (a runtime is built or removed independently).
    runtimes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The CUDA probe's record (`ortlab.gpu.probe_cuda`): devices, kernels run on them, what ORT on CUDA lacks.
    gpu: dict[str, Any] = field(default_factory=dict)
    # The device's dense matmul peak per precision, measured here (`ortlab.peak`): {"device": "cpu" or "cuda",
    # "precisions": {precision: MeasuredPeak as a dict, or {"error": ...}}}; empty when it could not be measured.
    peaks: dict[str, Any] = field(default_factory=dict)
    # Each probe group's answer as the cache holds it (`ortlab.probe.cache.GroupAnswer.summary`): outcome ("ok",
    # "timed out", "crashed"), when it was probed, in how many seconds, and when a failed one is tried again.
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    def gpu_findings(self) -> list[Any]:
        """The doctor's GPU rows (`ortlab.gpu.findings`) from the CUDA probe's record."""

        return findings(self.gpu) if self.gpu else []

    def __getitem__(self, name: str) -> Availability:
        return self.accelerations[name]

    def available(self, name: str) -> bool:
        return self.accelerations[name].available

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "executable": self.executable,
            "platform": self.platform,
            "torch": self.torch,
            "cuda": self.cuda,
            "devices": self.devices,
            "packages": self.packages,
            "accelerations": {k: v.to_dict() for k, v in self.accelerations.items()},
            "elapsed_s": round(self.elapsed_s, 2),
            "notes": self.notes,
            "probed_at": self.probed_at,
            "cached": self.cached,
            "runtimes": self.runtimes,
            "gpu": self.gpu,
            "gpu_findings": [f.to_dict() for f in self.gpu_findings()],
            "peaks": self.peaks,
            "groups": self.groups,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoctorReport:
        fields_ = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields_["accelerations"] = {k: Availability.from_dict(v) for k, v in data["accelerations"].items()}
        return cls(**fields_)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self, console: Any = None) -> None:
        """Print the human table (rich)."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        devices = ", ".join(d["name"] for d in self.devices) or "CPU only (no CUDA device)"
        if self.cached and self.probed_at:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.probed_at))
            timing = f"cached from {when}; `ortlab doctor --refresh` probes again"
        else:
            timing = f"probed in {self.elapsed_s:.1f} s"
        console.print(
            f"[bold]ortlab doctor[/] Python {self.python} ({self.executable}), torch {self.torch or 'missing'} "
            f"(CUDA build: {self.cuda or 'none'}); devices: {devices}  [dim]({timing})[/]"
        )
        table = Table(show_lines=True)
        table.add_column("acceleration", style="bold")
        table.add_column("available")
        table.add_column("reason")
        table.add_column("remedy")
        for name, a in self.accelerations.items():
            mark = "[green]yes[/]" if a.available and not a.slow else "[yellow]slow[/]" if a.available else "[red]no[/]"
            table.add_row(name, mark, a.reason, a.remedy)
        console.print(table)
        if self.gpu:
            gpu = Table(title="GPU (probed on the device)", show_lines=True)
            for col in ("check", "status", "reason", "remedy"):
                gpu.add_column(col)
            colour = {"yes": "green", "no": "red", "not checked": "yellow"}
            for f in self.gpu_findings():
                gpu.add_row(f.name, f"[{colour[f.status]}]{f.status}[/]", f.reason, f.remedy)
            console.print(gpu)
        if self.peaks:
            console.print(f"[bold]measured matmul peak[/]: {describe_peaks(self.peaks)}", soft_wrap=True)
        for name, rt in self.runtimes.items():
            console.print(f"[bold]{name} runtime[/]: {_describe_runtime(rt)}", soft_wrap=True)
        for note in self.notes:
            console.print(f"[yellow]note:[/] {note}")

    def __str__(self) -> str:
        lines = [f"Python {self.python}, torch {self.torch}, CUDA {self.cuda}"]
        for name, a in self.accelerations.items():
            lines.append(f"  {name:14} {'yes' if a.available else 'no ':3}  {a.reason}  -> {a.remedy}")
        return "\n".join(lines)


def describe_peaks(peaks: dict[str, Any]) -> str:
    """One line: each precision's measured dense matmul rate on the device (or why it has none); a precision the
    CPU has no hardware for is said to be emulated."""
    parts = []
    for kind, p in (peaks.get("precisions") or {}).items():
        if isinstance(p.get("flops"), (int, float)):
            how = [f"{p['size']}-side"] if "size" in p else []
            how += ["no hardware: emulated"] if p.get("hardware") is False else []
            parts.append(f"{kind} {p['flops'] / 1e12:.3g} TFLOP/s" + (f" ({'; '.join(how)})" if how else ""))
        else:
            parts.append(f"{kind} not measured ({p.get('error', 'unknown')})")
    first = next(iter((peaks.get("precisions") or {}).values()), {})
    where = f"{peaks.get('device', '?')}" + (f", {first['threads']} threads" if peaks.get("device") == "cpu" else "")
    return f"{', '.join(parts)} ({where}; square matmuls, the best of short repeats)"


def _describe_runtime(rt: dict[str, Any]) -> str:
    if not rt.get("ready"):
        return f"not built: {rt['why']}"
    tc = rt.get("torch_compile") or {}
    d = tc.get("details", {})
    if tc.get("available"):
        compiler = d.get("compiler_version") or d.get("compiler") or "?"
        inductor = f"Inductor on {d.get('device', '?')}" + ("" if d.get("inductor") else " (not imported)")
        what = f"{inductor}, C++ compiler {compiler}"
    else:
        what = f"torch.compile NOT available there: {tc.get('reason', 'not probed')}"
    return f"ready, torch {rt.get('torch')}, {what} ({rt['python']})"
