"""A tiny BERT trained for 4 steps through ortlab (`train_spec`), once eager and once with gradient checkpointing;
prints one JSON line: the transformers version that trained, each run's state, its last logged loss, and whether
checkpointing was verified as applied. Run in a child whose PYTHONPATH puts another transformers first, or in the
venv of the lowest declared versions (tests/test_floors.py)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transformers
from tiny_models import build_tiny_bert, write_reviews

from ortlab.runner import train_spec
from ortlab.spec import RunSpec


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ortlab-tiny-training-"))
    model, data = build_tiny_bert(tmp / "bert"), write_reviews(tmp / "reviews.csv", 64)
    out: dict = {"transformers": transformers.__version__}
    for name, checkpointing in (("eager", False), ("checkpointing", True)):
        spec = RunSpec.parse(
            {
                "model": {"name": str(model)},
                "data": {"source": str(data), "max_eval_samples": 16},
                "hyper": {"max_steps": 4, "batch_size": 8, "max_length": 32, "gradient_checkpointing": checkpointing},
                "accel": {"ort": False, "precision": "fp32"},
                "output_dir": str(tmp / name),
            }
        )
        run = Path(train_spec(spec, progress=False, log=lambda _: None)["run_dir"])
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        applied = [r["accelerations"]["gradient_checkpointing"] for r in records if "gradient_checkpointing" in
                   r.get("accelerations", {})]  # fmt: skip
        out[name] = {
            "state": json.loads((run / "status.json").read_text())["state"],
            "steps": sum(r.get("event") == "step" for r in records),
            "loss": next((r["loss"] for r in reversed(records) if r.get("event") == "step" and "loss" in r), None),
            "checkpointing_applied": bool(applied) and applied[-1]["applied"],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
