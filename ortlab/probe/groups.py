"""The doctor's probes: each group of accelerations is answered in a subprocess of its own (`python -m ortlab.probe
--probe GROUP`), because a broken ORT build can crash the interpreter and the notebook that asked must survive it.

A group's process prints one marked JSON line; the parent reads it, or, when the process crashed or ran past its
limit, an answer that says so ("timed out after 90 s", "crashed (exit code -6): ...") with every acceleration of the
group unavailable. Either way the answer is an answer: the cache keeps it (`ortlab.probe.cache`), a failed one with
a time after which it is tried again.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from ortlab.accel import Availability, availability_of, package_version
from ortlab.envvars import child_cwd, child_env
from ortlab.gpu import probe_cuda
from ortlab.peak import measure_all
from ortlab.toggles import TOGGLES

MARKER = "ORTLAB-PROBE-RESULT "
# Which accelerations each probe subprocess answers for (each toggle's `probe_group`, in the toggles' order). "torch"
# also reports the environment and the CUDA probe.
GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(t.name for t in TOGGLES if t.probe_group == group)
    for group in dict.fromkeys(t.probe_group for t in TOGGLES)
}
# The matmul peak (`ortlab.peak`): measured alone, after the groups above ended (a matmul timed while another process
# imports ORT is not a peak). Bounded by time (a few seconds a precision on any machine).
PEAK = "peak"
ALL = (*GROUPS, PEAK)
TIMEOUT_S = {**dict.fromkeys(GROUPS, 90.0), PEAK: 60.0}


def run_probe_group(group: str) -> dict[str, Any]:
    """In the probe subprocess: answer for one group, as a JSON-able dict."""
    if group == PEAK:
        import torch

        # Measured afresh (the doctor probes this group when its answer is missing, or when asked to: --refresh);
        # the training processes then read what it measured from `ortlab.peak`'s cache.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"peaks": {"device": device, "precisions": measure_all(device, refresh=True)}}
    out: dict[str, Any] = {"accelerations": {n: availability_of(n, probe=True).to_dict() for n in GROUPS[group]}}
    if group == "torch":
        out["environment"] = _environment()
        try:
            out["cuda"] = probe_cuda()
        except Exception as e:  # the CUDA probe must not cost the CPU rows their answer
            out["cuda"] = {"available": False, "reason": f"the CUDA probe failed: {type(e).__name__}: {e}"[:400]}
    return out


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


def start_probe(python: str, group: str) -> subprocess.Popen:
    """The group's probe process in `python` (this ortlab first on its path: probing a second runtime too)."""
    return subprocess.Popen(
        [python, "-m", "ortlab.probe", "--probe", group],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=child_env(),
        cwd=child_cwd(),  # (and a safe path, `child_env`): nothing imported from the caller's folder
    )


def failed(group: str, outcome: str, reason: str) -> dict[str, Any]:
    """The answer of a probe that did not answer: each of the group's accelerations unavailable, saying why."""
    remedy = (
        "`ortlab doctor --refresh` tries again now (on a busy machine, once it is quieter); if it persists, "
        "reinstall the package named in the reason"
    )
    found = {n: Availability(n, False, reason, remedy).to_dict() for n in GROUPS.get(group, ())}
    return {"accelerations": found, "outcome": outcome, "error": reason}


def collect(proc: subprocess.Popen, group: str, deadline: float) -> tuple[str, dict[str, Any]]:
    """(group, its answer) from its process, waiting at most until `deadline` (time.monotonic()). A timed-out or
    crashed probe gives `failed`'s answer, its `outcome` saying which."""
    return group, _answer(proc, group, deadline)


def _answer(proc: subprocess.Popen, group: str, deadline: float) -> dict[str, Any]:
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return failed(group, "timed out", f"the {group} probe did not finish within {TIMEOUT_S[group]:.0f} s")
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            return {**json.loads(line[len(MARKER) :]), "outcome": "ok"}
    tail = " | ".join(stderr.strip().splitlines()[-3:])[-400:]
    return failed(group, "crashed", f"the {group} probe crashed (exit code {proc.returncode}): {tail}")
