"""`ortlab doctor`: what this Python environment can run, each acceleration with its reason and remedy.

The probes are real (imports, and a tiny training step where that is the only way to know), and each group
runs in its own subprocess: a broken ORT build can crash the interpreter, and the notebook that asked must
survive that. The groups run in parallel, so the whole report takes about as long as importing
onnxruntime-training once (~10 s on an idle 2-core CPU, 40 s on a busy one).

That is too slow to pay every time, and the answer only changes when the environment does. So the report is
cached per environment fingerprint (`fingerprint()`: the interpreter, the versions of Python, torch, ORT,
transformers, DeepSpeed and friends, ORTModule's built extensions, the CPU's flags, the GPUs, and ortlab's
own probe code) in `cache_dir()/doctor/`; a warm `doctor()` reads a file and runs no probe.
`doctor(refresh=True)` (`ortlab doctor --refresh`) probes again. A probe that timed out or crashed is not
cached: that may be a busy machine, and the next call should try again. `cached_report()` answers from the
cache only (never probes), for callers that must not wait (the workbench, `ortlab info`).

`doctor(python=...)` probes another interpreter the same way, which is how ortlab checks a second runtime
(say, a newer torch for torch.compile) before launching a run there.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab import runtimes
from ortlab.accel import (
    ACCELERATIONS,
    Availability,
    fused_adam,
    ort,
    package_version,
    precision,
    tcmalloc,
    torch_compile,
    zero,
)
from ortlab.accel.ort import extensions_dir
from ortlab.envvars import cache_dir
from ortlab.gpu import findings
from ortlab.peak import REPEATS as PEAK_REPEATS
from ortlab.peak import cpu_facts, measure_all

MARKER = "ORTLAB-PROBE-RESULT "
PROBE_TIMEOUT_S = 90.0
PEAK_TIMEOUT_S = 60.0  # a second or two per precision, plus importing torch
# Which accelerations each probe subprocess answers for. "torch" also reports the environment.
GROUPS: dict[str, tuple[str, ...]] = {
    "torch": ("fused_adam", "fp16", "bf16", "tf32", "torch_compile"),
    "ort": ("ort",),
    "zero1": ("zero1",),
    "tcmalloc": ("tcmalloc",),
}


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
    """One line: each precision's measured dense matmul rate on the device (or why it has none)."""
    parts = []
    for kind, p in (peaks.get("precisions") or {}).items():
        if isinstance(p.get("flops"), (int, float)):
            parts.append(f"{kind} {p['flops'] / 1e12:.2f} TFLOP/s")
        else:
            parts.append(f"{kind} not measured ({p.get('error', 'unknown')})")
    first = next(iter((peaks.get("precisions") or {}).values()), {})
    where = f"{peaks.get('device', '?')}" + (f", {first['threads']} threads" if peaks.get("device") == "cpu" else "")
    size = f"{first['size']}x{first['size']} matmuls" if "size" in first else "matmuls"
    return f"{', '.join(parts)} ({where}; {size}, best of {PEAK_REPEATS} repeats)"


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


def _environment() -> dict[str, Any]:
    if package_version("torch") is None:
        return {}
    import torch

    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}",
                }
            )
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": devices}


def run_probe_group(group: str) -> dict[str, Any]:
    """In the probe subprocess: answer for one group, as a JSON-able dict."""
    if group == "peak":
        # Alone, after the other probes ended: a matmul timed while another process imports ORT is not a peak.
        import torch

        # Measured afresh: the doctor probes when its report is missing or stale, or when asked to (--refresh);
        # the training processes then read what it measured from `ortlab.peak`'s cache.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"accelerations": {}, "peaks": {"device": device, "precisions": measure_all(device, refresh=True)}}

    checks = {
        "ort": ort.check,
        "fused_adam": fused_adam.check,
        "zero1": zero.check,
        "fp16": precision.check_fp16,
        "bf16": precision.check_bf16,
        "tf32": precision.check_tf32,
        "torch_compile": torch_compile.check,
        "tcmalloc": tcmalloc.check,
    }
    out: dict[str, Any] = {"accelerations": {n: checks[n](probe=True).to_dict() for n in GROUPS[group]}}
    if group == "torch":
        out["environment"] = _environment()
        from ortlab.gpu import probe_cuda

        try:
            out["cuda"] = probe_cuda()
        except Exception as e:  # the CUDA probe must not cost the CPU rows their answer
            out["cuda"] = {"available": False, "reason": f"the CUDA probe failed: {type(e).__name__}: {e}"[:400]}
    return out


def _start(python: str, group: str) -> subprocess.Popen:
    env = dict(os.environ)
    # Make this ortlab importable in another interpreter too (probing a second runtime).
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    return subprocess.Popen(
        [python, "-m", "ortlab.probe", "--probe", group],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _failed(names: tuple[str, ...], reason: str) -> dict[str, Any]:
    remedy = "run `ortlab doctor` again; if it persists, reinstall the package named in the reason"
    # "transient": a timeout or a crash is never cached, the next doctor() probes again.
    found = {n: Availability(n, False, reason, remedy).to_dict() for n in names}
    return {"accelerations": found, "transient": True, "error": reason}


def _collect(proc: subprocess.Popen, group: str, deadline: float) -> dict[str, Any]:
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _failed(GROUPS.get(group, ()), f"the {group} probe did not finish within {PROBE_TIMEOUT_S:.0f} s")
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = " | ".join(stderr.strip().splitlines()[-3:])[-400:]
    return _failed(GROUPS.get(group, ()), f"the {group} probe crashed (exit code {proc.returncode}): {tail}")


def doctor(python: str | None = None, refresh: bool = False) -> DoctorReport:
    """Probe `python` (default: this interpreter) and report what it can run.

    Answers from the cache when this environment was probed before (see the module docstring); `refresh=True`
    probes again. Returns a `DoctorReport`; `ortlab doctor --json` prints `report.to_json()`.
    """
    start = time.monotonic()
    here = python is None or _same_interpreter(python)
    report = _doctor_one(python or sys.executable, refresh)
    if here:
        _add_runtimes(report, refresh)
    report.elapsed_s = time.monotonic() - start
    return report


def _doctor_one(python: str, refresh: bool) -> DoctorReport:
    facts = fingerprint(python)
    if not refresh:
        report = _read_cache(facts)
        if report is not None:
            return report
    report, transient = _probe(python)
    if not transient:
        _write_cache(facts, report)
    return report


def _add_runtimes(report: DoctorReport, refresh: bool, probe: bool = True) -> None:
    """Probe ortlab's other runtimes (each through its own cached doctor) and say where torch_compile runs.

    In the ORT runtime (torch 2.6) torch.compile cannot run, but a launched run that asks for it goes to the
    compile runtime by itself (`ortlab.runner.local.Local.interpreter`): the doctor says so, instead of a bare "no".
    """

    for name in runtimes.RUNTIMES:
        state = runtimes.state_of(name)
        entry: dict[str, Any] = {
            "ready": state.python is not None,
            "path": str(state.path),
            "python": str(state.python) if state.python else None,
            "why": state.why,
        }
        if state.python is not None and not _same_interpreter(str(state.python)):
            sub = _doctor_one(str(state.python), refresh) if probe else _read_cache(fingerprint(str(state.python)))
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


def cached_report(python: str | None = None) -> DoctorReport | None:
    """The cached report for this environment, or None if it was never probed (or changed since). Never probes:
    for views that must open at once (the workbench, `ortlab info`) and can say "not probed yet" instead."""
    python = python or sys.executable
    report = _read_cache(fingerprint(python))
    if report is not None and _same_interpreter(python):
        _add_runtimes(report, refresh=False, probe=False)  # their cached reports, or their stamps: no probe
    return report


def _probe(python: str) -> tuple[DoctorReport, bool]:
    """Run every probe group in parallel subprocesses, then the matmul peak alone. Returns the report and whether
    any probe failed in a way that may not last (a timeout or a crash)."""
    procs = {g: _start(python, g) for g in GROUPS}
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    results = {g: _collect(p, g, deadline) for g, p in procs.items()}
    peak = _collect(_start(python, "peak"), "peak", time.monotonic() + PEAK_TIMEOUT_S)
    found = {}
    for r in results.values():
        found.update(r["accelerations"])
    env = results["torch"].get("environment", {})
    info = _interpreter_info(python)
    notes = []
    if not env:
        notes.append("torch could not be imported in this environment: see the fused_adam row for the error")
    report = DoctorReport(
        python=info["python"],
        executable=python,
        platform=info["platform"],
        torch=env.get("torch"),
        cuda=env.get("cuda"),
        devices=env.get("devices", []),
        packages=info["packages"],
        accelerations={n: Availability.from_dict(found[n]) for n in ACCELERATIONS},
        notes=notes,
        probed_at=time.time(),
        gpu=results["torch"].get("cuda", {}),
        peaks=peak.get("peaks", {}),
    )
    if not report.peaks:
        report.notes.append(f"the matmul peak was not measured: {peak.get('error', 'the probe failed')}")
    return report, any(r.get("transient") for r in (*results.values(), peak))


# --- the cache -----------------------------------------------------------------------------------------------


def fingerprint(python: str | None = None) -> dict[str, Any]:
    """Everything the doctor's answer depends on, read without importing torch (cheap: well under a second).

    For another interpreter the facts are read there (one short subprocess), as its packages are its own.
    """
    python = python or sys.executable
    if _same_interpreter(python):
        facts = _local_facts()
    else:
        code = "import json, ortlab.probe as d; print(json.dumps(d._local_facts()))"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        try:
            out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=30)
            facts = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"broken": out.stderr}
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            facts = {"broken": str(e)}
    # The probes and checks are this ortlab's code (also when probing another interpreter): a change to them
    # can change the answer.
    facts["probe_code"] = _probe_code_hash()
    facts["executable"] = python
    return facts


def _same_interpreter(python: str) -> bool:
    # Compare without resolving symlinks: two virtual environments share one real interpreter binary.
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def _local_facts() -> dict[str, Any]:
    """This interpreter's side of the fingerprint."""

    ext_dir = extensions_dir()
    extensions = (
        sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in ext_dir.glob("*.so"))
        if ext_dir is not None and ext_dir.is_dir()
        else []
    )
    return {
        "python": platform.python_version(),
        "prefix": sys.prefix,
        "packages": {p: package_version(p) for p in PACKAGES},
        "ort_extensions": extensions,
        "cpu": cpu_facts(),
        "gpus": _gpu_facts(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Installing the allocator (or removing it) changes its row.
        "tcmalloc": str(tcmalloc.find()),
    }


def _gpu_facts() -> list[str]:
    """NVIDIA GPUs as the driver lists them (no CUDA initialisation, no torch import)."""
    found = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            found.append(" ".join(info.read_text(errors="replace").split()))
        except OSError:
            continue
    return found


def _probe_code_hash() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in [Path(__file__).resolve(), here / "gpu.py", here / "peak.py", *sorted((here / "accel").glob("*.py"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cache_path(facts: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return cache_dir() / "doctor" / f"{key}.json"


def _read_cache(facts: dict[str, Any]) -> DoctorReport | None:
    try:
        data = json.loads(_cache_path(facts).read_text())
        if data.get("fingerprint") != json.loads(json.dumps(facts, default=str)):
            return None
        report = DoctorReport.from_dict(data["report"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or from another ortlab: probe instead
    report.cached = True
    return report


def _write_cache(facts: dict[str, Any], report: DoctorReport) -> None:
    """Best effort: a read-only home must not make the doctor fail."""
    path = _cache_path(facts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"fingerprint": facts, "report": report.to_dict()}, indent=2, default=str))
        os.replace(tmp, path)
    except OSError:
        pass


PACKAGES = (
    "torch",
    "transformers",
    "datasets",
    "accelerate",
    "onnxruntime-training",
    "onnxruntime",
    "deepspeed",
    "huggingface_hub",
)


def _local_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {p: package_version(p) for p in PACKAGES},
    }


def _interpreter_info(python: str) -> dict[str, Any]:
    if _same_interpreter(python):
        return _local_info()
    code = "import json, ortlab.probe as d; print(json.dumps(d._local_info()))"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    if out.returncode != 0:
        return {"python": "unknown", "platform": "unknown", "packages": {}}
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe" and sys.argv[2] in (*GROUPS, "peak"):
        result = run_probe_group(sys.argv[2])
        sys.stdout.flush()
        print(MARKER + json.dumps(result), flush=True)
    else:
        print(f"usage: python -m ortlab.probe --probe {{{','.join(GROUPS)},peak}}", file=sys.stderr)
        sys.exit(2)
