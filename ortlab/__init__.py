"""ortlab: fine-tune Hugging Face models fast from Jupyter, with ONNX Runtime training and friends.

`import ortlab` is kept light on purpose (no torch, no transformers: they take seconds to import), so that a
notebook, the CLI and the Jupyter server extension start fast. Public names are resolved lazily on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ortlab._version import __version__

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "doctor": "ortlab.probe",
    "DoctorReport": "ortlab.probe",
    "Availability": "ortlab.accel",
    "ORTTrainer": "ortlab.train.trainer",
    "ORTTrainingArguments": "ortlab.train.args",
    "ORTOptimizerNames": "ortlab.train.compat",
    "ORTSeq2SeqTrainer": "ortlab.train.seq2seq",
    "ORTSeq2SeqTrainingArguments": "ortlab.train.seq2seq",
    "AccelerationNotApplied": "ortlab.train.trainer",
    "MixError": "ortlab.accel.mix",
    "RunSpec": "ortlab.spec",
    "Run": "ortlab.runner",
    "launch": "ortlab.runner",
    "runs": "ortlab.runner",
    "attach": "ortlab.runner",
    "Workbench": "ortlab.ui",
    "estimate": "ortlab.estimator",
    "Estimate": "ortlab.estimator",
}

__all__ = [
    "AccelerationNotApplied",
    "Availability",
    "DoctorReport",
    "Estimate",
    "MixError",
    "ORTOptimizerNames",
    "ORTSeq2SeqTrainer",
    "ORTSeq2SeqTrainingArguments",
    "ORTTrainer",
    "ORTTrainingArguments",
    "Run",
    "RunSpec",
    "Workbench",
    "__version__",
    "attach",
    "doctor",
    "estimate",
    "launch",
    "runs",
]

if TYPE_CHECKING:  # pragma: no cover
    from ortlab.accel import Availability
    from ortlab.accel.mix import MixError
    from ortlab.estimator import Estimate, estimate
    from ortlab.probe import DoctorReport, doctor
    from ortlab.runner import Run, attach, launch, runs
    from ortlab.spec import RunSpec
    from ortlab.train.args import ORTTrainingArguments
    from ortlab.train.compat import ORTOptimizerNames
    from ortlab.train.seq2seq import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments
    from ortlab.train.trainer import AccelerationNotApplied, ORTTrainer
    from ortlab.ui import Workbench


# submodules reachable as attributes without an explicit import (`ortlab.ui.RunMonitor(run)` after `import ortlab`)
_SUBMODULES = ("ui", "runner", "export", "publish", "discover", "spec", "notebooks")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """jupyter_server finds the extension `ortlab` (enabled by the installed jupyter_server_config.d/ortlab.json)
    here, and loads `ortlab.server` only then: importing ortlab itself stays light."""
    return [{"module": "ortlab.server"}]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f"ortlab.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ortlab' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
