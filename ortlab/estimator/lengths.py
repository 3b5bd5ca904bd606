"""The data's token lengths, from a sample: what a batch is padded to, on average (time) and at worst (memory).

ortlab pads each batch to its longest row (dynamic padding), so a step's cost follows the longest row of its batch,
not `max_length`: Rotten Tomatoes snippets are ~30 tokens, and a run estimated at max_length=128 would be 4x too
slow on paper. The first SAMPLE_ROWS rows of a local file (CSV, JSON lines, text) are read with the standard
library and tokenized with the model's `tokenizer.json` by the `tokenizers` library (no transformers import: it
takes seconds). Where that cannot be done (a Hub dataset, a tokenizer without tokenizer.json) every row is taken to
fill max_length, and the estimate says so. Causal LM on raw text trains on full blocks of max_length: no sample.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.assets import EMBEDDED_PREFIX, embedded_dataset
from ortlab.tasks import get_task

SAMPLE_ROWS = 512
MAX_LINE_CHARS = 200_000
BATCHES = 400  # random batches drawn from the sample to average the padded length
CHAT_TOKENS_PER_TURN = 6  # the template's role markers and separators around each turn (SmolLM2's: 5-7)


@dataclass(frozen=True)
class Lengths:
    """Padded lengths of a batch: its mean (step time) and its largest (peak memory), with what they rest on."""

    mean_padded: float
    peak: int
    basis: str
    rows: int | None = None  # rows in the training file, when counted (for epochs -> steps)


def _rows(path: Path, fmt: str, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        if fmt == "csv":
            for row in csv.DictReader(f):
                out.append(row)
                if len(out) >= limit:
                    break
        elif fmt == "json":
            for line in f:
                line = line[:MAX_LINE_CHARS].strip()
                if line:
                    value = json.loads(line)
                    if isinstance(value, dict):
                        out.append(value)
                if len(out) >= limit:
                    break
        else:
            for line in f:
                out.append({"text": line[:MAX_LINE_CHARS]})
                if len(out) >= limit:
                    break
    return out


def _count_rows(path: Path, fmt: str) -> int | None:
    if path.stat().st_size > 512 * 1024 * 1024:
        return None
    with path.open("rb") as f:
        lines = sum(1 for _ in f)
    return max(0, lines - (1 if fmt == "csv" else 0))


def _source(source: str, fmt: str) -> tuple[Path, str]:
    if source.startswith(EMBEDDED_PREFIX):
        return embedded_dataset(source[len(EMBEDDED_PREFIX) :])
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{source!r} is not a local file")
    if fmt == "auto":
        suffix = path.suffix.lower()
        fmt = {".csv": "csv", ".json": "json", ".jsonl": "json", ".txt": "text"}.get(suffix, "")
        if not fmt:
            raise ValueError(f"cannot tell the format of {path.name}")
    return path, fmt


def _texts(row: dict[str, Any], data: Any) -> str:
    """The text of a row that the model reads: the named columns, else every string column but the label."""
    for name in ("messages_column", "prompt_column"):
        column = getattr(data, name, None)
        if column and column in row:
            turns = row[column] if isinstance(row[column], list) else [{"content": row[column]}]
            extra = [row.get(data.response_column)] if name == "prompt_column" else []
            contents = [t.get("content", "") if isinstance(t, dict) else str(t) for t in turns] + extra
            return "\n".join(str(c) for c in contents if c)
    named = [getattr(data, n, None) for n in ("text_column", "text_pair_column", "source_column")]
    named = [n for n in named if n and n in row]
    if named:
        return " ".join(str(row[n]) for n in named)
    if isinstance(row.get("messages"), list):
        return "\n".join(str(t.get("content", "")) for t in row["messages"] if isinstance(t, dict))
    skip = {getattr(data, "label_column", None), getattr(data, "target_column", None), "label", "labels"}
    return " ".join(str(v) for k, v in row.items() if k not in skip and isinstance(v, str))


def sample_lengths(spec: Any, tokenizer_folder: Path | None, batch: int, max_length: int) -> Lengths:
    """The padded lengths of `spec`'s batches of `batch` rows at `max_length`, from a sample of its data."""
    data = spec.data
    if get_task(spec.task).blocks and not (data.messages_column or data.prompt_column):
        blocks = f"raw text trains on full blocks of {max_length}"
        try:
            path, fmt = _source(data.source, data.format)
            chat = fmt == "json" and "messages" in (_rows(path, fmt, 1) or [{}])[0]
            if not chat:  # the number of blocks: the sample's tokens per row, times the rows
                raw, total = _tokenized(data, tokenizer_folder)
                rows = math.ceil((total or 0) * (sum(raw) / len(raw)) / max_length) if raw and total else None
                return Lengths(float(max_length), max_length, blocks, rows)
        except Exception:
            return Lengths(float(max_length), max_length, blocks)
    if data.packing:
        return Lengths(float(max_length), max_length, f"packed rows fill blocks of {max_length}")
    try:
        raw, total = _tokenized(data, tokenizer_folder)
        lengths = [min(max_length, n) for n in raw]
    except Exception as e:  # any reason not to sample: the estimate assumes the worst and says why
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        return Lengths(float(max_length), max_length, f"every row assumed to fill max_length ({why})")
    if not lengths:
        return Lengths(float(max_length), max_length, "no rows sampled: every row assumed to fill max_length")
    rng = random.Random(0)
    b = min(batch, len(lengths))
    mean = sum(max(rng.sample(lengths, b)) for _ in range(BATCHES)) / BATCHES
    return Lengths(
        mean,
        max(lengths),
        f"{len(lengths)} rows tokenized: mean {sum(lengths) / len(lengths):.0f}, longest {max(lengths)} tokens",
        total,
    )


# (data section as JSON, tokenizer folder, file size and time) -> (token lengths, rows): a refusal's remedies
# estimate the spec again several times, and the sample is the one slow part.
_CACHE: dict[tuple, tuple[list[int], int | None]] = {}


def _tokenized(data: Any, tokenizer_folder: Path | None) -> tuple[list[int], int | None]:
    path, fmt = _source(data.source, data.format)
    if tokenizer_folder is None or not (tokenizer_folder / "tokenizer.json").is_file():
        raise FileNotFoundError("the model folder has no tokenizer.json")
    stat = path.stat()
    key = (data.model_dump_json(), str(tokenizer_folder), str(path), stat.st_size, stat.st_mtime_ns)
    if key in _CACHE:
        return _CACHE[key]
    rows = _rows(path, fmt, SAMPLE_ROWS)
    total = _count_rows(path, fmt)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    tokenizer.no_padding()  # (some tokenizer.json files pad every row to a fixed length: the collator does not)
    tokenizer.no_truncation()
    texts = [_texts(r, data) for r in rows]
    encoded = tokenizer.encode_batch([t or " " for t in texts])
    chat = bool(data.messages_column or data.prompt_column or any(isinstance(r.get("messages"), list) for r in rows))
    extra = 3 * CHAT_TOKENS_PER_TURN if chat else 0
    lengths = [len(e.ids) + extra for e in encoded]
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = (lengths, total)
    return lengths, total
