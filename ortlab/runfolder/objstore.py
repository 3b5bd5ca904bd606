"""A cluster run's storage in an object store (`s3://`, `gs://`, ...): where no disk is shared.

KubeRay, Anyscale or a lab's Ray on VMs share no disk with a laptop, so the run folder cannot be one folder that
both sides open. With `target.storage` a URI, the run folder lives in three places:

    this machine          the local run folder, as for every run (the monitor fills it, see `ortlab.runner.monitor`)
    the object store      <storage>/<run id>/: spec.yaml, status.json, control/, metrics.jsonl, checkpoints
                          (each with an `.ortlab-uploaded` marker written last), model/, result.json
    the job's node        a node-local run folder the job trains in (`ortlab.job.mirror`), pulled from the store at
                          the start and pushed back while it trains and when it ends

The live records come home through the job's log (`ortlab.job.channel`); a Ray Train run's also from the stored
stream, which its monitor follows (`StoredStream`, the shorter way: `ortlab.runner.livestream`). The store is for what
must survive the job: the spec it starts from, the checkpoints a resume needs, the results `export` and `push` read,
and the stop and pause requests on their way in. Files go through pyarrow's file systems (installed with
`datasets`), which take credentials from each side's own environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, a GCP
service account): ortlab never reads, writes or passes them.

The store is not trusted more than a run folder: a key with `..` or an absolute part is never downloaded (it would
land outside the folder), downloads are written through `safeio` (no link followed), and small files are read
with a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ortlab import safeio
from ortlab.addresses import storage_scheme
from ortlab.errors import OrtlabError
from ortlab.runfolder.rundir import (
    DAMAGED,
    RESUMABLE,
    STATES,
    TRANSITIONS,
    RunStateError,
    checkpoint_step,
    pause_step,
)
from ortlab.runfolder.stream import CHUNK_BYTES, METRICS_FILE, MetricsStream

UPLOADED = ".ortlab-uploaded"  # written last into a stored checkpoint: the checkpoint is whole
PIECE = 8 * 1024 * 1024  # bytes per read or write when a file is copied (models are large; memory stays flat)
SMALL = ("spec.yaml", "status.json", "tune.json", "result.json")
MAX_STREAM_BYTES = 1 << 30  # a stored metrics.jsonl read whole (a long run's is a few MB)


class StoreError(OrtlabError, RuntimeError):
    """An object store cannot be used as asked (no client library, an option it does not know, a write that does
    not read back, a stored run that is not there): the message says which store and why."""


def is_uri(storage: str | os.PathLike | None) -> bool:
    return isinstance(storage, str) and storage_scheme(storage) is not None


class Store:
    """One folder of an object store, `uri` (scheme://bucket/prefix, with the file system's options as a query,
    e.g. `?endpoint_override=http://127.0.0.1:9000` for an S3-protocol server such as MinIO)."""

    def __init__(self, uri: str, _fs: Any = None, _root: str | None = None):
        self.uri = uri
        if _fs is None:
            try:
                from pyarrow import fs as pafs
            except ImportError:
                raise StoreError(f"target.storage {uri}: an object store needs pyarrow (pip install pyarrow)") from None
            try:
                _fs, _root = pafs.FileSystem.from_uri(_opened_as(uri))
            except Exception as e:  # an option pyarrow does not know, a scheme this pyarrow was built without
                raise StoreError(f"target.storage {uri}: {type(e).__name__}: {e}") from None
        self.fs, self.root = _fs, (_root or "").rstrip("/")

    def __str__(self) -> str:
        return self.uri

    def child(self, name: str) -> Store:
        """The folder `name` inside this one (one plain name)."""
        _key_parts(name)
        parts = urlsplit(self.uri)
        uri = urlunsplit((parts.scheme, parts.netloc, f"{parts.path.rstrip('/')}/{name}", parts.query, ""))
        return Store(uri, self.fs, f"{self.root}/{name}")

    @property
    def name(self) -> str:
        return PurePosixPath(self.root).name

    def key(self, rel: str) -> str:
        return "/".join([self.root, *_key_parts(rel)])

    # --- small files ----------------------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        return self.fs.get_file_info(self.key(rel)).type != pafs.FileType.NotFound

    def read_bytes(self, rel: str, limit: int = safeio.MAX_JSON_BYTES) -> bytes:
        """A small object, whole; FileNotFoundError when absent, safeio.TooLarge past `limit` bytes."""
        key = self.key(rel)
        try:
            with self.fs.open_input_stream(key) as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            raise
        except OSError as e:
            if _absent(e):
                raise FileNotFoundError(key) from None
            raise
        if len(data) > limit:
            raise safeio.TooLarge(f"{self.uri}/{rel} is larger than {limit} bytes")
        return data

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.fs.open_output_stream(self.key(rel)) as f:
            f.write(data)

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.key(rel))

    def files(self, rel: str = "") -> dict[str, int]:
        """Every object below `rel` (relative to it) with its size. A key that is not a plain relative path
        (`..`, empty parts) is left out: nothing lands outside the folder it is copied into."""
        from pyarrow import fs as pafs

        top = self.key(rel) if rel else self.root
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(top, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return {}
        found = {}
        for info in infos:
            if info.type == pafs.FileType.File and info.path.startswith(top + "/"):
                name = info.path[len(top) + 1 :]
                with contextlib.suppress(safeio.UnsafePath):
                    _key_parts(name)
                    found[name] = info.size
        return found

    # --- whole folders ---------------------------------------------------------------------------------------

    def upload(self, folder: Path, rel: str) -> list[str]:
        """Copy the regular files below local `folder/rel` to `rel` here, each opened without following a link;
        returns what could not be copied, as "path (why)"."""
        skipped = []
        base = folder / rel
        for path in safeio.regular_files(base):
            name = path.relative_to(base).as_posix()
            try:
                fd = safeio.open_in(folder, f"{rel}/{name}")
            except OSError as e:
                skipped.append(f"{rel}/{name} ({e.strerror or e})")
                continue
            self._send(fd, f"{rel}/{name}")
        return skipped

    def download(self, rel: str, folder: Path, dest: str | None = None) -> int:
        """Copy every object below `rel` into local `folder/dest` (default `rel`); returns the bytes copied.
        Written through safeio (a new file renamed into place, no link followed)."""
        copied = 0
        for name, size in sorted(self.files(rel).items()):
            with self.fs.open_input_stream(self.key(f"{rel}/{name}")) as src:
                safeio.write_pieces(folder, f"{dest or rel}/{name}", iter(lambda: src.read(PIECE), b""))
            copied += size
        return copied

    def records(self, rel: str) -> Iterator[dict[str, Any]]:
        """The records of a JSON-lines object, read by the run folder's one bounded reader (`MetricsStream`): in
        pieces, a line that is not a record passed over, a last line without its newline not counted. None when
        the object is absent; memory stays flat whatever its size."""
        try:
            f = self.fs.open_input_file(self.key(rel))
        except FileNotFoundError:
            return
        except OSError as e:
            if _absent(e):
                return
            raise
        with f:
            yield from MetricsStream(self.uri, name=rel).records_from(f.read_at, f.size(), max_bytes=None)

    def put(self, folder: Path, rel: str) -> None:
        """One local file (`folder/rel`, opened without following a link) copied here in pieces: a stream of any
        size is pushed with flat memory, where reading it whole would need a bound it may pass."""
        self._send(safeio.open_in(folder, rel), rel)

    def _send(self, fd: int, rel: str) -> None:
        """The open local file `fd` (closed here) written to `rel`, a piece at a time."""
        with os.fdopen(fd, "rb") as src, self.fs.open_output_stream(self.key(rel)) as dst:
            while piece := src.read(PIECE):
                dst.write(piece)

    def append_records(self, rel: str, records: list[dict[str, Any]]) -> None:
        """Records appended to a small JSON-lines object (read, extended, written: objects cannot be appended to,
        so only one writer may do this at a time; ortlab's callers are each the one writer of their file)."""
        try:
            data = self.read_bytes(rel)
        except FileNotFoundError:
            data = b""
        self.write_bytes(rel, data + "".join(safeio.dumps(r) + "\n" for r in records).encode())

    def probe(self) -> None:
        """Write, read back and remove a small object: StoreError with the reason when any of it fails."""
        rel = f".ortlab-probe-{secrets.token_hex(6)}"
        data = secrets.token_bytes(32)
        try:
            self.write_bytes(rel, data)
            try:
                back = self.read_bytes(rel)
            finally:
                self.remove(rel)
        except Exception as e:
            raise StoreError(
                f"cannot write and read {self.uri}: {type(e).__name__}: {str(e).splitlines()[0]}"
            ) from None
        if back != data:
            raise StoreError(f"{self.uri}: an object written there read back different")


class StoredStream:
    """A stored JSON-lines object followed as it grows (the monitor's live view of a Ray Train run, whose rank 0
    pushes its stream every `ortlab.wire.LIVE_S`): each `read` asks once whether the object grew (one HEAD, the
    whole cost of a read that finds nothing new) and reads only its new part (ranged reads, at most CHUNK_BYTES a
    call), through the run folder's one bounded reader. An object that shrank was replaced: it is read again from
    its start, and `on_restart` is called (the caller's count of records starts again at 0)."""

    def __init__(self, store: Store, name: str = METRICS_FILE, on_restart: Callable[[], None] | None = None):
        self.store = store
        self.stream = MetricsStream(store.uri, name=name, on_restart=on_restart)

    def read(self) -> list[dict[str, Any]]:
        if self.stream.offset >= MAX_STREAM_BYTES:  # (the bound of every read of a stored stream)
            return []
        try:  # (opening it is the HEAD: pyarrow learns its size; nothing more is asked when it did not grow)
            f = self.store.fs.open_input_file(self.store.key(self.stream.name))
        except FileNotFoundError:
            return []
        except OSError as e:
            if _absent(e):
                return []
            raise
        with f:
            size = f.size()
            if size == self.stream.offset:
                return []
            # One ranged GET of the new part, from the byte before it (the reader checks that the last read ended
            # a line: a request of its own otherwise); what lies past it is read by the reader as it needs it.
            start = max(self.stream.offset - 1, 0)
            head = f.read_at(min(size - start, CHUNK_BYTES), start) if size > start else b""

            def read_at(n: int, at: int) -> bytes:
                if start <= at < start + len(head):
                    return head[at - start : at - start + n]
                return b"" if at >= size else f.read_at(n, at)

            return list(self.stream.records_from(read_at, size, max_bytes=CHUNK_BYTES))


def _opened_as(uri: str) -> str:
    """The URI pyarrow opens: an S3 store writes a small object in one PUT (`allow_delayed_open`; pyarrow's default
    starts a multipart upload for every file, three requests a write: measured on the tests' server, 26 ms a write
    against 14, and three round trips to a distant store). A URI that sets the option itself keeps its own."""
    query = urlsplit(uri).query
    if storage_scheme(uri) != "s3" or "allow_delayed_open" in query:
        return uri
    return f"{uri}{'&' if query else '?'}allow_delayed_open=true"


def read_limit(name: str) -> int:
    """How much of a run folder's file is read whole: the stream may be long, the JSON documents are small."""
    return MAX_STREAM_BYTES if name == "metrics.jsonl" else safeio.MAX_JSON_BYTES


def _absent(e: OSError) -> bool:
    """Is `e` the store's way of saying a key is not there? (pyarrow raises OSError with the service's words.)"""
    return "not exist" in str(e).lower() or "not found" in str(e).lower()


def _key_parts(rel: str) -> tuple[str, ...]:
    parts = tuple(rel.split("/"))
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise safeio.UnsafePath(f"{rel!r} is not a plain relative path inside the storage folder")
    return parts


# --- a run folder in the store, as the launcher and the monitor see it ------------------------------------------


class StoredRun:
    """A run folder in an object store, behind the same `RunPlace` interface as a local `RunDir` (see `place`):
    what `RayJob`, the monitor and the job do with a run folder (create it, claim it for a resume, pass stop and
    pause on, append records, fetch checkpoints and results), where there is no folder to open.

    Every file is read as a run folder's is: bounded, parsed defensively; a status that cannot be read is
    `damaged` with the reason, never an exception."""

    def __init__(self, store: Store):
        self.store = store

    path = property(lambda self: self.store.uri)  # what status.json records, and what the job is given
    id = property(lambda self: self.store.name)

    def __str__(self) -> str:
        return self.store.uri

    def create(self, spec_yaml: bytes) -> None:
        self.store.write_bytes("spec.yaml", spec_yaml)
        self.write_status({"state": "pending", "updated": time.time()})

    def read_status(self) -> dict[str, Any]:
        """status.json as stored: `missing`, or `damaged` with the reason when it is not a run status."""
        try:
            status = json.loads(self.store.read_bytes("status.json"))
        except FileNotFoundError:
            return {"state": "missing"}
        except (OSError, ValueError, RecursionError) as e:  # TooLarge, a read that failed, not JSON
            return {"state": DAMAGED, DAMAGED: f"the stored status.json cannot be read: {type(e).__name__}: {e}"}
        if not isinstance(status, dict) or status.get("state") not in STATES:
            return {"state": DAMAGED, DAMAGED: "the stored status.json is not a run status"}
        return status

    def write_status(self, status: dict[str, Any]) -> None:
        self.store.write_bytes("status.json", safeio.dumps(status, indent=2).encode())

    def set_status(self, state: str, **fields: Any) -> None:
        current = self.read_status()
        if state not in TRANSITIONS.get(current.get("state"), frozenset()):
            why = f": {current[DAMAGED]}" if current.get("state") == DAMAGED else ""
            raise RunStateError(
                f"the stored run {self.store.uri} is {current.get('state')}{why}: it cannot become {state}"
            )
        self.write_status({**current, **fields, "state": state, "updated": time.time()})

    def claim(self, **fields: Any) -> None:
        """For a resume: a stopped or failed stored run becomes pending, its stop and pause requests cleared
        first. The job that ran it has ended (the launcher checked), so nothing else writes its status now."""
        status = self.read_status()
        if status.get("state") not in RESUMABLE:
            why = f": {status[DAMAGED]}" if status.get("state") == DAMAGED else ""
            raise RunStateError(f"the stored run {self.store.uri} is {status.get('state')}{why}")
        self.clear_stop()
        self.clear_pause()
        self.set_status("pending", **fields)

    def request_stop(self) -> None:
        self.store.write_bytes("control/stop", str(time.time()).encode())

    def stop_requested(self) -> bool:
        return self.store.exists("control/stop")

    def clear_stop(self) -> None:
        self.store.remove("control/stop")

    def request_pause(self, at_step: int | None = None) -> None:
        self.store.write_bytes("control/pause", b"" if at_step is None else str(int(at_step)).encode())

    def read_pause(self) -> str | None:
        """As `RunDir.read_pause`: None, "" (now) or the step's digits; anything else stored there means now."""
        try:
            text = self.store.read_bytes("control/pause", limit=64).decode("ascii", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError:  # too long, unreadable: its presence is the ask
            return ""
        return text if pause_step(text) is not None else ""

    def clear_pause(self) -> None:
        self.store.remove("control/pause")

    def records(self, name: str = METRICS_FILE) -> Iterator[dict[str, Any]]:
        return self.store.records(name)

    def follow(self, name: str = METRICS_FILE, on_restart: Callable[[], None] | None = None) -> StoredStream:
        """The records of `name` as they are added (see `StoredStream`)."""
        return StoredStream(self.store, name, on_restart)

    def append_records(self, name: str, records: list[dict[str, Any]]) -> None:
        self.store.append_records(name, records)

    def read_small(self, name: str, limit: int = safeio.MAX_JSON_BYTES) -> bytes:
        """A small file of the run (result.json, ...), bounded; FileNotFoundError when absent."""
        return self.store.read_bytes(name, limit=limit)

    def read_tail(self, name: str, start: int) -> Iterator[bytes]:
        """`name`'s bytes from `start` on, in pieces, up to MAX_STREAM_BYTES (the bound of every read of a stored
        stream); nothing when it is absent or no longer than `start` (one request to learn that)."""
        from pyarrow import fs as pafs

        info = self.store.fs.get_file_info(self.store.key(name))
        end = min(info.size, MAX_STREAM_BYTES) if info.type == pafs.FileType.File else 0
        if end <= start:
            return
        with self.store.fs.open_input_file(self.store.key(name)) as src:
            src.seek(start)
            while start < end and (piece := src.read(min(PIECE, end - start))):
                start += len(piece)
                yield piece

    def put_file(self, folder: Path, name: str) -> None:
        """One local file (`folder/name`, no link followed) stored here in pieces: flat memory, whatever its size."""
        self.store.put(folder, name)

    def put_folder(self, folder: Path, rel: str) -> list[str]:
        """The regular files below local `folder/rel` stored here; what could not be, as "path (why)"."""
        return self.store.upload(folder, rel)

    def mark_whole(self, rel: str) -> None:
        """The marker that says the stored checkpoint `rel` is whole (written last: see `last_checkpoint_name`)."""
        self.store.write_bytes(f"{rel}/{UPLOADED}", b"")

    def has(self, rel: str) -> bool:
        """Is there a file at or below `rel`? (An empty "folder" is nothing: a store's client may leave folder
        markers behind when the files are deleted.)"""
        from pyarrow import fs as pafs

        return self.store.fs.get_file_info(self.store.key(rel)).type == pafs.FileType.File or bool(
            self.store.files(rel)
        )

    def last_checkpoint_name(self) -> str | None:
        """The newest stored checkpoint whose upload finished (its marker is there), e.g. `checkpoint-10`."""
        names = {name.split("/")[0] for name in self.store.files("checkpoints") if name.endswith("/" + UPLOADED)}
        numbered = [n for n in names if checkpoint_step(n) is not None]
        return max(numbered, key=lambda n: checkpoint_step(n) or 0, default=None)

    last_checkpoint = last_checkpoint_name

    def fetch(self, rel: str, folder: Path, dest: str) -> list[str]:
        """Every object below `rel` into local `folder/dest` (through safeio); what was left out, as "x (why)"
        (nothing: a key that is not a plain relative path is never listed). The marker of a stored checkpoint
        stays behind: locally, trainer_state.json says a checkpoint is whole."""
        self.store.download(rel, folder, dest)
        safeio.remove(folder, f"{dest}/{UPLOADED}")
        return []
