"""The doctor's cache: each probe group's answer in a file of its own, keyed by the environment's fingerprint.

The doctor's answer changes only when the environment does, so it is kept per fingerprint (`fingerprint()`: the
interpreter, the versions of Python, torch, ORT, transformers, DeepSpeed and friends, ORTModule's built extensions,
the CPU's visible flags, the GPUs, the allocator, and ortlab's own probe code) under
`cache_dir()/doctor/<key>/<group>.json`.

Every probe lands here, whatever its outcome (issue #42): before, one group that timed out or crashed kept the whole
report out of the cache, and on a CPU without bf16 hardware the peak probe always timed out, so every call probed
for minutes. Now a group is kept on its own (one slow group never discards the others' answers), and a failed one
is kept as failed ("timed out after 90 s") with `retry_after`: the doctor tries it again once that time has passed
(BACKOFF_S, doubling with each failure in a row up to MAX_BACKOFF_S), not on every call; `--refresh` tries now.

One process probes an environment at a time (`locked`, the kernel's flock, so a killed holder releases it): a second
caller waits and takes what the first one found, so an environment is never probed twice at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.accel import Availability, package_version, tcmalloc
from ortlab.accel.ort import extensions_dir
from ortlab.cpuinfo import cpu_facts
from ortlab.envvars import cache_dir, child_cwd, child_env
from ortlab.probe.groups import GROUPS

BACKOFF_S = 600.0
MAX_BACKOFF_S = 86400.0
MAX_ANSWER_BYTES = 1 << 20
FACTS_TIMEOUT_S = 30
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


@dataclass
class GroupAnswer:
    """One probe group's answer as cached: what the probe returned, and how it went."""

    group: str
    result: dict[str, Any]  # the probe's JSON (accelerations; the environment; the peaks)
    outcome: str  # "ok", "timed out" or "crashed"
    probed_at: float  # epoch seconds
    seconds: float  # how long the probe took
    failures: int = 0  # failed probes in a row (0 when ok)
    retry_after: float | None = None  # a failed answer is probed again after this (epoch seconds)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def due(self, now: float) -> bool:
        """A failed answer whose back-off has passed: the doctor tries the group again."""
        return not self.ok and (self.retry_after is None or now >= self.retry_after)

    def summary(self) -> dict[str, Any]:
        """What a report shows of it (`DoctorReport.groups`)."""
        return {k: v for k, v in asdict(self).items() if k not in ("group", "result")}


def answered(group: str, result: dict[str, Any], seconds: float, before: GroupAnswer | None) -> GroupAnswer:
    """The answer to keep for a probe that just ran; a failure's back-off doubles with each failure in a row."""
    now = time.time()
    outcome = result.pop("outcome", "ok")
    if outcome == "ok":
        return GroupAnswer(group, result, outcome, now, round(seconds, 2))
    failures = (before.failures if before is not None and not before.ok else 0) + 1
    backoff = min(BACKOFF_S * 2 ** (failures - 1), MAX_BACKOFF_S)
    return GroupAnswer(group, result, outcome, now, round(seconds, 2), failures, now + backoff)


def _key(facts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def folder(facts: dict[str, Any]) -> Path:
    """Where this environment's answers are kept."""
    return cache_dir() / "doctor" / _key(facts)


def read(facts: dict[str, Any], group: str) -> GroupAnswer | None:
    """The cached answer of `group` for this environment, or None (never probed, another environment, unreadable)."""
    try:
        data = json.loads(safeio.read_bytes(folder(facts), f"{group}.json", limit=MAX_ANSWER_BYTES))
        if data.get("fingerprint") != json.loads(json.dumps(facts, default=str)):
            return None
        answer = GroupAnswer(**data["answer"])
        if answer.group != group or not isinstance(answer.result, dict) or not isinstance(answer.probed_at, float):
            return None
        found = answer.result.get("accelerations", {})
        for name in GROUPS.get(group, ()):  # every row the report takes from it, readable
            Availability.from_dict(found[name])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable, damaged or from another ortlab: probe instead
    return answer


def write(facts: dict[str, Any], answer: GroupAnswer) -> None:
    """Best effort: a read-only home must not make the doctor fail (it probes again next time)."""
    where = folder(facts)
    try:
        where.mkdir(parents=True, exist_ok=True)
        safeio.write_json(where, f"{answer.group}.json", {"fingerprint": facts, "answer": asdict(answer)}, False)
    except OSError:
        pass


@contextlib.contextmanager
def locked(facts: dict[str, Any], waiting: Any = None) -> Iterator[None]:
    """Hold this environment's probe lock; `waiting()` is called once if another process holds it (it is probing).
    Without a writable cache there is nothing to share: the block runs unlocked."""
    where = folder(facts)
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = safeio.open_in(where, ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


# --- the fingerprint ------------------------------------------------------------------------------------------


def fingerprint(python: str | None = None) -> dict[str, Any]:
    """Everything the doctor's answer depends on, read without importing torch (well under a second).

    For another interpreter the facts are read there (one short subprocess), as its packages are its own.
    """
    python = python or sys.executable
    if same_interpreter(python):
        facts = local_facts()
    else:
        code = "import json, ortlab.probe.cache as c; print(json.dumps(c.local_facts()))"
        try:
            out = subprocess.run(
                [python, "-c", code],
                capture_output=True,
                text=True,
                env=child_env(),
                cwd=child_cwd(),
                stdin=subprocess.DEVNULL,
                timeout=FACTS_TIMEOUT_S,
            )
            facts = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"broken": out.stderr}
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            facts = {"broken": str(e)}
    # The probes and checks are this ortlab's code (also when probing another interpreter): a change to them
    # can change the answer.
    facts["probe_code"] = _probe_code_hash()
    facts["executable"] = python
    return facts


def same_interpreter(python: str) -> bool:
    # Compare without resolving symlinks: two virtual environments share one real interpreter binary.
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def local_facts() -> dict[str, Any]:
    """This interpreter's side of the fingerprint (also what the report says of the interpreter)."""
    ext_dir = extensions_dir()
    extensions = (
        sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in ext_dir.glob("*.so"))
        if ext_dir is not None and ext_dir.is_dir()
        else []
    )
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "prefix": sys.prefix,
        "packages": {p: package_version(p) for p in PACKAGES},
        "ort_extensions": extensions,
        "cpu": cpu_facts(),
        "gpus": gpu_facts(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Installing the allocator (or removing it) changes its row.
        "tcmalloc": str(tcmalloc.find()),
    }


def gpu_facts() -> list[str]:
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
    pkg = here.parent
    h = hashlib.sha256()
    for path in [
        *sorted(here.glob("*.py")),
        pkg / "gpu.py",
        pkg / "peak.py",
        pkg / "cpuinfo.py",
        *sorted((pkg / "accel").glob("*.py")),
    ]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
