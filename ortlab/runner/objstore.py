"""A cluster run's storage in an object store (`s3://`, `gs://`, ...): where no disk is shared.

KubeRay, Anyscale or a lab's Ray on VMs share no disk with a laptop, so the run folder cannot be one folder that
both sides open. With `target.storage` a URI, the run folder lives in three places:

    this machine          the local run folder, as for every run (the monitor fills it, see `raychannel`)
    the object store      <storage>/<run id>/: spec.yaml, status.json, control/, metrics.jsonl, checkpoints
                          (each with an `.ortlab-uploaded` marker written last), model/, result.json
    the job's node        a node-local run folder the job trains in (`objsync.Mirror`), pulled from the store at
                          the start and pushed back while it trains and when it ends

The live records still come home through the job's log (`raychannel`); the store is for what must survive the
job: the spec it starts from, the checkpoints a resume needs, the results `export` and `push` read, and the stop
and pause requests on their way in. Files go through pyarrow's file systems (installed with `datasets`), which
take credentials from each side's own environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, a GCP service account):
ortlab never reads, writes or passes them.

The store is not trusted more than a run folder: a key with `..` or an absolute part is never downloaded (it would
land outside the folder), downloads are written through `safeio` (no link followed), and small files are read
with a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ortlab import safeio
from ortlab.addresses import storage_scheme
from ortlab.runfolder.rundir import TRANSITIONS, RunDir, RunStateError
from ortlab.runner.launcher import RunError

UPLOADED = ".ortlab-uploaded"  # written last into a stored checkpoint: the checkpoint is whole
PIECE = 8 * 1024 * 1024  # bytes per read or write when a file is copied (models are large; memory stays flat)
SMALL = ("spec.yaml", "status.json", "tune.json", "result.json")
MAX_STREAM_BYTES = 1 << 30  # a stored metrics.jsonl read whole (a long run's is a few MB)


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
                raise RunError(f"target.storage {uri}: an object store needs pyarrow (pip install pyarrow)") from None
            try:
                _fs, _root = pafs.FileSystem.from_uri(uri)
            except Exception as e:  # an option pyarrow does not know, a scheme this pyarrow was built without
                raise RunError(f"target.storage {uri}: {type(e).__name__}: {e}") from None
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
            if "not exist" in str(e).lower() or "not found" in str(e).lower():
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
            with os.fdopen(fd, "rb") as src, self.fs.open_output_stream(self.key(f"{rel}/{name}")) as dst:
                while piece := src.read(PIECE):
                    dst.write(piece)
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

    def records(self, rel: str) -> list[dict[str, Any]]:
        """The records of a small JSON-lines object (none when it is absent)."""
        try:
            return jsonl_records(self.read_bytes(rel))
        except FileNotFoundError:
            return []

    def append_records(self, rel: str, records: list[dict[str, Any]]) -> None:
        """Records appended to a small JSON-lines object (read, extended, written: objects cannot be appended to,
        so only one writer may do this at a time; ortlab's callers are each the one writer of their file)."""
        try:
            data = self.read_bytes(rel)
        except FileNotFoundError:
            data = b""
        self.write_bytes(rel, data + "".join(safeio.dumps(r) + "\n" for r in records).encode())

    def probe(self) -> None:
        """Write, read back and remove a small object: RunError with the reason when any of it fails."""
        rel = f".ortlab-probe-{secrets.token_hex(6)}"
        data = secrets.token_bytes(32)
        try:
            self.write_bytes(rel, data)
            try:
                back = self.read_bytes(rel)
            finally:
                self.remove(rel)
        except Exception as e:
            raise RunError(f"cannot write and read {self.uri}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if back != data:
            raise RunError(f"{self.uri}: an object written there read back different")


def read_limit(name: str) -> int:
    """How much of a run folder's file is read whole: the stream may be long, the JSON documents are small."""
    return MAX_STREAM_BYTES if name == "metrics.jsonl" else safeio.MAX_JSON_BYTES


def jsonl_records(data: bytes) -> list[dict[str, Any]]:
    """The records of JSON-lines bytes: a line that is not a JSON object is passed over (as the local reader
    does), and a last line without its newline was cut and is not counted."""
    found = []
    for line in data.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                found.append(record)
    return found


def _key_parts(rel: str) -> tuple[str, ...]:
    parts = tuple(rel.split("/"))
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise safeio.UnsafePath(f"{rel!r} is not a plain relative path inside the storage folder")
    return parts


# --- a run folder in the store, as the launcher and the monitor see it ------------------------------------------


class StoredRun:
    """A run folder in an object store: what `RayJob` and the monitor do with a remote run folder (create it,
    claim it for a resume, pass stop and pause on, bring the results home), where there is no folder to open."""

    def __init__(self, store: Store):
        self.store = store

    path = property(lambda self: self.store.uri)  # what status.json records, and what the job is given
    id = property(lambda self: self.store.name)

    def create(self, spec_yaml: bytes) -> None:
        self.store.write_bytes("spec.yaml", spec_yaml)
        self.write_status({"state": "pending", "updated": time.time()})

    def read_status(self) -> dict[str, Any]:
        try:
            status = json.loads(self.store.read_bytes("status.json"))
        except FileNotFoundError:
            return {"state": "missing"}
        return status if isinstance(status, dict) else {"state": "damaged"}

    def write_status(self, status: dict[str, Any]) -> None:
        self.store.write_bytes("status.json", safeio.dumps(status, indent=2).encode())

    def set_status(self, state: str, **fields: Any) -> None:
        current = self.read_status()
        if state not in TRANSITIONS.get(current.get("state"), frozenset()):
            raise RunStateError(f"the stored run {self.store.uri} is {current.get('state')}: it cannot become {state}")
        self.write_status({**current, **fields, "state": state, "updated": time.time()})

    def claim(self, **fields: Any) -> None:
        """For a resume: a stopped or failed stored run becomes pending, its stop and pause requests cleared
        first. The job that ran it has ended (the launcher checked), so nothing else writes its status now."""
        state = self.read_status().get("state")
        if state not in ("stopped", "failed"):
            raise RunStateError(f"the stored run {self.store.uri} is {state}")
        self.clear_stop()
        self.clear_pause()
        self.set_status("pending", **fields)

    def request_stop(self) -> None:
        self.store.write_bytes("control/stop", str(time.time()).encode())

    def clear_stop(self) -> None:
        self.store.remove("control/stop")

    def request_pause(self, at_step: int | None = None) -> None:
        self.store.write_bytes("control/pause", b"" if at_step is None else str(int(at_step)).encode())

    def clear_pause(self) -> None:
        self.store.remove("control/pause")

    def metrics_bytes(self) -> bytes:
        """The stored metrics.jsonl (the job pushes it while it trains and when it ends)."""
        try:
            return self.store.read_bytes("metrics.jsonl", limit=MAX_STREAM_BYTES)
        except FileNotFoundError:
            return b""

    def last_checkpoint(self) -> str | None:
        """The newest stored checkpoint whose upload finished (its marker is there), e.g. `checkpoint-10`."""
        names = {name.split("/")[0] for name in self.store.files("checkpoints") if name.endswith("/" + UPLOADED)}
        numbered = [n for n in names if n.startswith("checkpoint-") and n.split("-")[-1].isdigit()]
        return max(numbered, key=lambda n: int(n.split("-")[-1]), default=None)

    def bring_home(self, run: RunDir) -> None:
        """model/, result.json, tune.json and the last finished checkpoint, into the local run folder."""
        for name in ("result.json", "tune.json"):
            with contextlib.suppress(FileNotFoundError):
                safeio.write_bytes(run.path, name, self.store.read_bytes(name), durable=True)
        if self.store.files("model"):
            shutil.rmtree(run.model_dir, ignore_errors=True)
            self.store.download("model", run.path)
        shutil.rmtree(run.checkpoints, ignore_errors=True)
        self.fetch_last_checkpoint(run)

    def fetch_last_checkpoint(self, run: RunDir) -> str | None:
        """The newest whole stored checkpoint, downloaded into `run`'s checkpoints/ (without its marker: locally,
        trainer_state.json says a checkpoint is whole); its name, or None when there is none."""
        last = self.last_checkpoint()
        if last is not None:
            self.store.download(f"checkpoints/{last}", run.path)
            safeio.remove(run.path, f"checkpoints/{last}/{UPLOADED}")
        return last
