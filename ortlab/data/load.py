"""Finding and loading a dataset: embedded, a local file or folder, or a Hub id; every split, unchecked."""

from __future__ import annotations

import os
import re
import stat
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
    try:
        found = path.exists()
    except OSError as e:  # a name too long for the file system, a loop of links: the OS says which
        shown = source if len(source) <= 80 else source[:77] + "..."
        raise DataError(f"data.source: {shown!r} cannot be opened: {e.strerror}") from None
    if found:
        files = data_files(path, source)
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


def data_files(path: Path, source: str) -> list[Path]:
    """The data files `source` (at `path`, which exists) names: itself when it is a file, else the files with a data
    suffix below it.

    The path the user gave is followed wherever it points (a link they named is their choice, as a spec file's path
    is). Below a folder nothing is followed: a link with a data suffix would train the model on a file from
    anywhere (another user's, another project's), so it is refused, naming it; a linked folder is not entered (as
    before). A FIFO or a device is refused before anything opens it: reading a FIFO waits for a writer forever, and a
    device is no dataset. A look before datasets opens the files by path, not a lock (the folder is the user's)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(
            f"data.source: {source!r} is not a regular file or a folder (a FIFO, a socket or a device): ortlab reads "
            "data from files; save the data to a file and name it"
        )
    files, refused = [], []
    for folder, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(folder, d))]):
            entry = Path(folder, name)
            if entry.suffix not in SUFFIX_FORMATS:
                continue
            mode = os.lstat(entry).st_mode
            if stat.S_ISREG(mode):
                files.append(entry)
            else:
                why = "a link" if stat.S_ISLNK(mode) else "not a regular file"
                refused.append(f"{entry.relative_to(path).as_posix()} ({why})")
    if refused:
        shown = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        raise DataError(
            f"data.source: the folder {source!r} holds data files that are not its own: {shown}; ortlab does not "
            "follow links (or read FIFOs and devices) inside a data folder: copy the file into the folder, or name "
            "it as data.source itself"
        )
    return files


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
        raise read_error(e, spec.source, fmt) or DataError(
            f"data.source: could not read {spec.source!r} as {fmt}: {_first_line(e)}"
        ) from None
    return dict(loaded), files or []


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__


def read_error(e: BaseException, source: str, fmt: str = "csv") -> DataError | None:
    """A DataError naming the row, for a CSV that pandas could not parse (an unclosed quote, a row with more fields
    than the header), wherever it surfaced: in `load_raw` (datasets wraps it: "An error occurred while generating
    the dataset"), in a stream's first rows read for the checks, or when training reads a stream's later rows.
    None when `e` (or what it wraps) is not such an error."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if type(cause).__name__ == "ParserError" and type(cause).__module__.startswith("pandas"):
            return DataError(f"data.source: {source!r} is not valid {fmt.upper()}: {_parser_words(_first_line(cause))}")
        cause = cause.__cause__ or cause.__context__
    return None


def _parser_words(said: str) -> str:
    """pandas' C parser's message in ortlab's words, with the file's line (counted from 1, the header is line 1):
    pandas counts the rows of an unclosed quote from 0 and the lines of a row with extra fields from 1."""
    said = said.removeprefix("Error tokenizing data. C error: ")
    if match := re.search(r"EOF inside string starting at row (\d+)", said):
        return (
            f"a quote opens on line {int(match.group(1)) + 1} and never closes (it would swallow every line after "
            'it); close it, or double a quote that is part of the text ("say ""hi""")'
        )
    if match := re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", said):
        expected, line, saw = match.groups()
        return (
            f"line {line} has {saw} fields where the header has {expected}; quote a field that holds the separator, "
            "or fix that line"
        )
    return said[:300]
