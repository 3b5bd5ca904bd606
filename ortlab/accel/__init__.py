"""The accelerations ortlab can apply, one module each.

    ort            ONNX Runtime training: the model runs inside ORTModule (ort.py: its availability and the build;
                   ort_module.py: wrapping and fallback; ort_capture.py: can the forward be captured)
    fused_adam     a fused AdamW: ORT's FusedAdam on CUDA, torch's fused AdamW elsewhere (fused_adam.py)
    zero1          DeepSpeed ZeRO stage 1: optimizer state sharded across processes (zero.py)
    fp16, bf16     mixed precision (precision.py)
    tf32           TF32 tensor-core matmuls for fp32 on Ampere+ GPUs (precision.py)
    torch_compile  torch.compile (torch_compile.py)
    tcmalloc       tcmalloc as the training process's allocator, preloaded by whoever starts it (tcmalloc.py)

Each module has an `availability()` that says whether the acceleration can run in *this* Python environment and why
(precision.py one per precision: `bf16_availability`, `fp16_availability`, `tf32_availability`), and the small
function that applies it. `ortlab doctor` and the trainer share these, so what the doctor promises is what the trainer
accepts. The list of accelerations is `ortlab.toggles.TOGGLES`, a layer below this one, which names each one's
availability by its path; `availability_of` here resolves it (importing the module then, so `import ortlab.accel`
loads none of them, and a test that patches `ortlab.accel.ort.availability` is what the doctor calls).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import import_module
from typing import Any

from ortlab.toggles import NAMES, Toggle, toggle

# The doctor's rows, by the one vocabulary of acceleration names (`ortlab.toggles`).
ACCELERATIONS = NAMES
# Ends the reason of a check that passed on static facts only (versions, files) and was not tried for real; views
# that say so once for all rows (the workbench) take it off each row.
NOT_PROBED = " (not probed)"


@dataclass(frozen=True)
class Availability:
    """Whether one acceleration can run here.

    `reason` always says why (also when available: which implementation, which device), and `remedy` says what
    to do about it, so that a user never has to guess. `slow` marks an acceleration that runs but is known to
    be slower than not using it on this machine (e.g. bf16 on a CPU without bf16 instructions).
    """

    name: str
    available: bool
    reason: str
    remedy: str
    slow: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Availability:
        return cls(**data)


@dataclass
class Applied:
    """What really happened to one acceleration in a run: asked for, really in effect, and how.

    `applied` is only True when ortlab verified it (ORT built a training session and did not fall back; the
    optimizer that exists is the fused one; DeepSpeed's engine runs the requested ZeRO stage ...).
    """

    name: str
    requested: bool
    applied: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, without importing it (importing torch takes seconds)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def availability_function(which: Toggle | str) -> Any:
    """The function that says whether the acceleration `which` (a toggle, or its name) can run here: its module's
    `availability`, or the function its toggle names ("module:function"). Looked up when called, not kept: a test's
    patch of the module's function is what every caller gets."""
    t = toggle(which) if isinstance(which, str) else which
    module, _, function = t.availability.partition(":")
    return getattr(import_module(module), function or "availability")


def availability_of(which: Toggle | str, probe: bool = False) -> Availability:
    """Whether the acceleration `which` (a toggle, or its name) can run here, with its reason and remedy; `probe`
    tries it for real where its module can (the doctor's subprocesses do)."""
    function = availability_function(which)
    return function(probe=True) if probe else function()
