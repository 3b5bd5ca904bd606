"""Experiment trackers: transformers' `report_to`, passed through, kept offline and inside the run folder.

ortlab's own metrics stream (metrics.jsonl) is what its faces read; a tracker is for the user who already keeps
their experiments in one (trackio, TensorBoard, MLflow, W&B). transformers' integrations already log the losses,
the learning rate and the evaluations, so ortlab does not re-implement any of them: it passes `report_to` on,
and adds two things:

- where they write: trackio and TensorBoard write into the run folder (`trackers/trackio`, `trackers/tensorboard`),
  never to a server, so a run stays one self-contained folder; W&B runs offline (`WANDB_MODE=offline`) and MLflow
  writes a local store under `trackers/` unless the user configured either (their own variables win);
- what the run is: the spec and the accelerations it asked for (`ortlab_config` in the training arguments, which
  every integration records as the run's config or hparams), and, once verified after the first step, the
  accelerations that really applied.

A tracker that is not installed fails before launch, naming the package to install.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ortlab.envvars import temporary_env
from ortlab.toggles import FIELDS

logger = logging.getLogger("ortlab")

# The names transformers' report_to uses, and the package each needs.
PACKAGES: dict[str, str] = {"trackio": "trackio", "tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
FOLDER = "trackers"


def not_installed(names: list[str]) -> list[str]:
    """One problem per requested tracker whose package is missing here (checked without importing it)."""
    from importlib.util import find_spec

    return [
        f"report_to: {name!r} needs the {PACKAGES[name]} package, which is not installed: pip install {PACKAGES[name]}"
        for name in names
        if find_spec(PACKAGES[name]) is None
    ]


def environment(names: list[str], run_path: Path) -> dict[str, str]:
    """The environment variables that keep the requested trackers offline and in the run folder.

    trackio reads TRACKIO_DIR (its local SQLite store) and transformers' TensorBoard callback
    TENSORBOARD_LOGGING_DIR: ortlab sets both, so the run folder holds everything. W&B and MLflow keep what the
    user set (a team's server is a deliberate choice); unset, they stay offline and local.
    """
    folder = run_path / FOLDER
    env: dict[str, str] = {}
    if "trackio" in names:
        env["TRACKIO_DIR"] = str(folder / "trackio")
    if "tensorboard" in names:
        env["TENSORBOARD_LOGGING_DIR"] = str(folder / "tensorboard")
    if "wandb" in names:
        env.setdefault("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))
        env.setdefault("WANDB_DIR", os.environ.get("WANDB_DIR", str(folder)))
    if "mlflow" in names and not os.environ.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = (folder / "mlruns").resolve().as_uri()
    return env


@contextmanager
def offline(names: list[str], run_path: Path) -> Iterator[dict[str, str]]:
    """Set `environment(...)` for the length of a run (trackers read it when the trainer is built and trains)."""
    values = environment(names, run_path)
    if "TRACKIO_DIR" in values and "trackio.utils" in sys.modules:
        # trackio fixes its folder when first imported; a second run in the same process (a notebook) would write
        # into the first run's folder. Say so rather than pretend.
        current = str(getattr(sys.modules["trackio.utils"], "TRACKIO_DIR", ""))
        if current != values["TRACKIO_DIR"]:
            logger.warning(
                "ortlab: trackio was already imported in this process and writes to %s, not to this run's folder "
                "(launch the run, ortlab.launch(spec) or `ortlab train`, to give it its own)",
                current,
            )
    if values.get("TRACKIO_DIR"):
        Path(values["TRACKIO_DIR"]).mkdir(parents=True, exist_ok=True)
    with temporary_env(values):
        yield values


def run_config(spec: Any, resolved: Any) -> dict[str, Any]:
    """What the trackers record as the run's config: the spec as written, and the mix it resolved to: every
    acceleration toggle's field (`ortlab.toggles.FIELDS`) with its resolved value, and the adapter."""
    return {
        "spec": spec.model_dump(mode="json"),
        "requested_mix": {**{f: getattr(resolved, f) for f in FIELDS}, "adapter": spec.adapter.kind},
    }


def log_applied(callbacks: list[Any], args: Any, applied: dict[str, bool]) -> None:
    """Give the running trackers the accelerations that really applied (verified after the first step).

    transformers' integrations record `args` when they start a run (trackio starts again for the evaluation
    after training): the applied mix goes into `args.ortlab_config` for those, and to each tracker that is
    already running through its own API.
    """
    config = getattr(args, "ortlab_config", None)
    if isinstance(config, dict):
        config["applied_mix"] = dict(applied)
    for callback in callbacks:
        name = type(callback).__name__
        try:
            if name == "TensorBoardCallback" and getattr(callback, "tb_writer", None) is not None:
                callback.tb_writer.add_text("ortlab/applied_mix", json.dumps(applied), 0)
                callback.tb_writer.flush()
            elif name == "TrackioCallback" and getattr(callback, "_initialized", False):
                callback._trackio.config.update({"ortlab_applied_mix": dict(applied)})
            elif name == "WandbCallback" and getattr(getattr(callback, "_wandb", None), "run", None) is not None:
                callback._wandb.config.update({"ortlab_applied_mix": dict(applied)}, allow_val_change=True)
            elif name == "MLflowCallback" and _mlflow_run(callback) is not None:
                callback._ml_flow.set_tags({f"ortlab.applied.{k}": str(v) for k, v in applied.items()})
        except Exception as e:  # a tracker's hiccup must not stop training; it is logged to the run's log
            logger.warning("ortlab: could not give %s the applied accelerations: %s", name, e)


def _mlflow_run(callback: Any) -> Any:
    mlflow = getattr(callback, "_ml_flow", None)
    return mlflow.active_run() if mlflow is not None else None


def finish(callbacks: list[Any]) -> None:
    """Close the local trackers once the run's last evaluation is logged, while their output still goes to the
    run's log (trackio flushes on exit otherwise, printing to the user's screen after ortlab's summary)."""
    for callback in callbacks:
        name = type(callback).__name__
        try:
            if name == "TrackioCallback" and getattr(callback, "_initialized", False):
                callback._trackio.finish()
                callback._initialized = False
            elif name == "TensorBoardCallback" and getattr(callback, "tb_writer", None) is not None:
                callback.tb_writer.close()
                callback.tb_writer = None
        except Exception as e:
            logger.warning("ortlab: could not close %s: %s", name, e)
