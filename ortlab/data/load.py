"""Finding and loading a dataset: embedded, a local file or folder, or a Hub id; every split, unchecked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.assets import EMBEDDED_PREFIX, embedded_dataset
from ortlab.data.prepared import DataError
from ortlab.hub import HubUnavailable, hub_repo_exists

if TYPE_CHECKING:  # pragma: no cover
    from ortlab.spec import DataSpec

SUFFIX_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
}


def resolve_source(spec: DataSpec) -> tuple[str, list[str] | None]:
    """('csv'|'json'|'parquet'|'text', files) for local and embedded data, or ('hub', None) for a Hub id."""
    source = spec.source
    if source.startswith(EMBEDDED_PREFIX):
        try:
            path, fmt = embedded_dataset(source[len(EMBEDDED_PREFIX) :])
        except ValueError as e:
            raise DataError(f"data.source: {e}") from None
        return fmt, [str(path)]
    path = Path(os.path.expanduser(source))
    if path.exists():
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIX_FORMATS)
        if not files:
            raise DataError(f"data.source: the folder {source!r} has no data files ({', '.join(SUFFIX_FORMATS)})")
        fmt = spec.format
        if fmt == "auto":
            fmts = {SUFFIX_FORMATS.get(p.suffix) for p in files}
            if None in fmts or len(fmts) != 1:
                raise DataError(
                    f"data.source: cannot tell the format of {source!r} from its suffix; set data.format to one "
                    "of csv, json, parquet, text"
                )
            fmt = fmts.pop()
        return fmt, [str(p) for p in files]
    if source.startswith((".", "/", "~")) or Path(source).suffix in SUFFIX_FORMATS:
        raise DataError(f"data.source: the file or folder {source!r} does not exist")
    return "hub", None


def _check_hub_dataset(spec: DataSpec) -> None:

    try:
        exists = hub_repo_exists(spec.source, repo_type="dataset")
    except HubUnavailable as e:
        raise DataError(
            f"data.source: {spec.source!r} is not a local file or folder, and the Hugging Face Hub is not "
            f"reachable ({e}). Use a local file, an embedded dataset (embedded:rotten-tomatoes), or go online."
        ) from None
    if not exists:
        raise DataError(f"data.source: no dataset {spec.source!r} on the Hugging Face Hub (check the id)")


STREAM_ABOVE_BYTES = 1_000_000_000  # data.streaming 'auto': Hub datasets the Hub says are larger are streamed


def hub_dataset_bytes(source: str, config_name: str | None) -> int | None:
    """The size the Hub's metadata gives for a dataset (its card's dataset_info), or None when it says none."""
    try:
        from huggingface_hub import HfApi

        card = HfApi().dataset_info(source).card_data
        infos = (card.to_dict() if card is not None else {}).get("dataset_info") or []
    except Exception:
        return None
    infos = infos if isinstance(infos, list) else [infos]
    sizes = [
        int(i.get("dataset_size") or i.get("download_size") or 0)
        for i in infos
        if isinstance(i, dict) and (config_name is None or i.get("config_name") in (None, config_name))
    ]
    return max(sizes) if any(sizes) else None


def streams(spec: DataSpec, fmt: str) -> bool:
    """Whether `load_raw` reads this source as a stream: data.streaming true, or 'auto' and a Hub dataset the
    Hub's metadata says is over STREAM_ABOVE_BYTES (a local file is read in place by Arrow either way)."""
    if spec.streaming != "auto":
        return bool(spec.streaming)
    if fmt != "hub":
        return False
    size = hub_dataset_bytes(spec.source, spec.config_name)
    return size is not None and size > STREAM_ABOVE_BYTES


def load_raw(spec: DataSpec, streaming: bool | None = None) -> tuple[dict[str, Any], list[str]]:
    """Load every split of the source (datasets' IterableDatasets when streamed: `streams`). Local files become one
    'train' split."""
    import datasets

    fmt, files = resolve_source(spec)
    try:
        if fmt == "hub":
            _check_hub_dataset(spec)  # first: an unreachable Hub or a wrong id is said at once, in ortlab's words
        stream = streams(spec, fmt) if streaming is None else streaming
        if fmt == "hub":
            loaded = datasets.load_dataset(spec.source, spec.config_name, streaming=stream)
        else:
            kw = {"delimiter": "\t"} if files and all(f.endswith(".tsv") for f in files) else {}
            loaded = datasets.load_dataset(fmt, data_files={"train": files}, streaming=stream, **kw)
    except DataError:
        raise
    except Exception as e:
        if "corresponds to no data" in str(e):  # datasets' words for a file with a header and no rows
            raise DataError(f"data.source: {spec.source!r} is empty (no rows)") from None
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise DataError(f"data.source: could not read {spec.source!r} as {fmt}: {first}") from None
    return dict(loaded), files or []
