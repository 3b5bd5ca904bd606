"""The measurement cache: a `TuneResult` per (model, shapes, candidates, environment), as JSON files under
`ortlab.envvars.cache_dir()/tune` (`tune_cache_dir`), so the next run with the same model and shapes reuses the
measurement.

The key holds everything that makes a measurement valid only here (the processor, the accelerator, the library
versions, the model's config and weight files): change any of them and the key changes, so a stale table is never
reused. A file that does not read back as a `TuneResult` is a miss, not an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.accel import package_version
from ortlab.envvars import cache_dir
from ortlab.tune.mixes import MixCandidate
from ortlab.tune.result import TuneResult

CACHE_VERSION = 1


def tune_cache_dir() -> Path:
    """Where tune keeps its measurements: under ortlab's cache (`ortlab.envvars.cache_dir`)."""
    return cache_dir() / "tune"


def measurement_environment() -> dict[str, Any]:
    """What makes a measurement valid only here: the processor, the accelerator, the library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {
            d: package_version(d) for d in ("torch", "transformers", "onnxruntime-training", "deepspeed", "ortlab")
        },
    }
    import torch

    if torch.cuda.is_available():
        env["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    env["threads"] = torch.get_num_threads()
    return env


def model_identity(model_path: str, revision: str | None) -> dict[str, Any]:
    """A local folder by its config and weight files (a changed checkpoint is another model); a Hub id by id."""
    path = Path(model_path)
    if not path.is_dir():
        return {"id": model_path, "revision": revision}
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.name == "config.json":
            digest.update(f.read_bytes())
        elif f.suffix in (".safetensors", ".bin", ".gguf"):
            digest.update(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}".encode())
    return {"folder": str(path.resolve()), "files": digest.hexdigest()[:16]}


def cache_key(identity: dict, shapes: dict, candidates: list[MixCandidate], env: dict) -> str:
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "model": identity,
            "shapes": shapes,
            "candidates": [asdict(c) for c in candidates],
            "env": env,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached(key: str) -> TuneResult | None:
    path = tune_cache_dir() / f"{key}.json"
    try:
        result = TuneResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    result.cached = True
    return result


def store_result(result: TuneResult) -> None:
    tune_cache_dir().mkdir(parents=True, exist_ok=True)
    safeio.write_json(tune_cache_dir(), f"{result.key}.json", result.to_dict())
