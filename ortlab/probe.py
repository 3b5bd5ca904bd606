"""`ortlab doctor`: what this Python environment can run, each acceleration with its reason and remedy.

The probes are real (imports, and a tiny training step where that is the only way to know), and each group
runs in its own subprocess: a broken ORT build can crash the interpreter, and the notebook that asked must
survive that. The groups run in parallel, so the whole report takes about as long as importing
onnxruntime-training once (~10 s on a 2-core CPU).

`doctor(python=...)` probes another interpreter the same way, which is how ortlab checks a second runtime
(say, a newer torch for torch.compile) before launching a run there.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.accel import ACCELERATIONS, Availability, package_version

MARKER = "ORTLAB-PROBE-RESULT "
PROBE_TIMEOUT_S = 90.0
# Which accelerations each probe subprocess answers for. "torch" also reports the environment.
GROUPS: dict[str, tuple[str, ...]] = {
    "torch": ("fused_adam", "fp16", "bf16", "torch_compile"),
    "ort": ("ort",),
    "zero1": ("zero1",),
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
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self, console: Any = None) -> None:
        """Print the human table (rich)."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        devices = ", ".join(d["name"] for d in self.devices) or "CPU only (no CUDA device)"
        console.print(
            f"[bold]ortlab doctor[/] Python {self.python} ({self.executable}), torch {self.torch or 'missing'} "
            f"(CUDA build: {self.cuda or 'none'}); devices: {devices}  [dim]({self.elapsed_s:.1f} s)[/]"
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
        for note in self.notes:
            console.print(f"[yellow]note:[/] {note}")

    def __str__(self) -> str:
        lines = [f"Python {self.python}, torch {self.torch}, CUDA {self.cuda}"]
        for name, a in self.accelerations.items():
            lines.append(f"  {name:14} {'yes' if a.available else 'no ':3}  {a.reason}  -> {a.remedy}")
        return "\n".join(lines)


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
    from ortlab.accel import fused_adam, ort, precision, torch_compile, zero

    checks = {
        "ort": ort.check,
        "fused_adam": fused_adam.check,
        "zero1": zero.check,
        "fp16": precision.check_fp16,
        "bf16": precision.check_bf16,
        "torch_compile": torch_compile.check,
    }
    out: dict[str, Any] = {"accelerations": {n: checks[n](probe=True).to_dict() for n in GROUPS[group]}}
    if group == "torch":
        out["environment"] = _environment()
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
    return {"accelerations": {n: Availability(n, False, reason, remedy).to_dict() for n in names}}


def _collect(proc: subprocess.Popen, group: str, deadline: float) -> dict[str, Any]:
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _failed(GROUPS[group], f"the {group} probe did not finish within {PROBE_TIMEOUT_S:.0f} s")
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = " | ".join(stderr.strip().splitlines()[-3:])[-400:]
    return _failed(GROUPS[group], f"the {group} probe crashed (exit code {proc.returncode}): {tail}")


def doctor(python: str | None = None) -> DoctorReport:
    """Probe `python` (default: this interpreter) and report what it can run.

    Returns a `DoctorReport`; `ortlab doctor --json` prints `report.to_json()`.
    """
    start = time.monotonic()
    python = python or sys.executable
    procs = {g: _start(python, g) for g in GROUPS}
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    results = {g: _collect(p, g, deadline) for g, p in procs.items()}
    found = {}
    for r in results.values():
        found.update(r["accelerations"])
    env = results["torch"].get("environment", {})
    info = _interpreter_info(python)
    notes = []
    if not env:
        notes.append("torch could not be imported in this environment: see the fused_adam row for the error")
    return DoctorReport(
        python=info["python"],
        executable=python,
        platform=info["platform"],
        torch=env.get("torch"),
        cuda=env.get("cuda"),
        devices=env.get("devices", []),
        packages=info["packages"],
        accelerations={n: Availability.from_dict(found[n]) for n in ACCELERATIONS},
        elapsed_s=time.monotonic() - start,
        notes=notes,
    )


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
    if Path(python).resolve() == Path(sys.executable).resolve():
        return _local_info()
    code = "import json, ortlab.probe as d; print(json.dumps(d._local_info()))"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    if out.returncode != 0:
        return {"python": "unknown", "platform": "unknown", "packages": {}}
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe" and sys.argv[2] in GROUPS:
        result = run_probe_group(sys.argv[2])
        sys.stdout.flush()
        print(MARKER + json.dumps(result), flush=True)
    else:
        print(f"usage: python -m ortlab.probe --probe {{{','.join(GROUPS)}}}", file=sys.stderr)
        sys.exit(2)
