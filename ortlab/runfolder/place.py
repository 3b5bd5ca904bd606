"""A run place: where a run's folder lives, behind one interface, whatever the kind.

    RunDir       a folder on a disk this process opens (the local run folder; a folder both sides mount)
    StoredRun    a folder in an object store (`objstore`), where there is no folder to open

Launchers, the monitor and the job talk to a `RunPlace` and never ask which kind they hold: status with its
state machine, the claim of a resume, stop and pause requests, JSON-lines records by name, the last whole
checkpoint, small files, fetching a folder home and pushing a job's node-local copy back. A launcher keeps its
runs' places in a `RunStorage` (a `SharedFolder`, or an `ObjectStorage`): probe it, make a new place there, find
the place a status names (`named`, and `place_in`, which also asks the place's secret), say where a run's place
is expected. Only this module tells the kinds apart: `storage_at` turns a spec's `target.storage` into a storage,
`place_at` turns what a status or a job's command line records (a path, or a URI) into a place, and `folder_here`
answers the job's one question of a place (can it train in it directly?). `bring_home` copies a finished run's
results from any place into the local run folder, and loses nothing on the way (see its docstring).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from ortlab import safeio
from ortlab.runfolder.objstore import Store, StoredRun, StoreError, is_uri
from ortlab.runfolder.rundir import RunDir, _checkpoint_complete


class RunPlace(Protocol):
    """What every kind of run place offers (RunDir and StoredRun both implement it)."""

    @property
    def id(self) -> str: ...
    @property
    def path(self) -> Any: ...  # where it is: a Path, or a URI (what status.json records and a job is given)

    def read_status(self) -> dict[str, Any]: ...
    def set_status(self, state: str, **fields: Any) -> Any: ...
    def claim(self, **fields: Any) -> Any: ...
    def request_stop(self) -> None: ...
    def stop_requested(self) -> bool: ...
    def clear_stop(self) -> None: ...
    def request_pause(self, at_step: int | None = None) -> None: ...
    def read_pause(self) -> str | None: ...
    def clear_pause(self) -> None: ...
    def records(self, name: str = ...) -> Iterator[dict[str, Any]]: ...
    def follow(self, name: str = ..., on_restart: Callable[[], None] | None = ...) -> Follows: ...
    def append_records(self, name: str, records: list[dict[str, Any]]) -> None: ...
    def read_small(self, name: str, limit: int = ...) -> bytes: ...
    def has(self, rel: str) -> bool: ...
    def last_checkpoint_name(self) -> str | None: ...
    def fetch(self, rel: str, folder: Path, dest: str) -> list[str]: ...
    # A job's node-local copy, pushed here and followed from here (`ortlab.job.mirror`):
    def read_tail(self, name: str, start: int) -> Iterator[bytes]: ...
    def put_file(self, folder: Path, name: str) -> None: ...
    def put_folder(self, folder: Path, rel: str) -> list[str]: ...
    def mark_whole(self, rel: str) -> None: ...


class Follows(Protocol):
    """A JSON-lines file of a run place, followed as it grows (`RunPlace.follow`)."""

    def read(self) -> list[dict[str, Any]]: ...


class RunStorage(Protocol):
    """Where a launcher keeps the remote run places of its runs (`target.storage`): a `SharedFolder` or an
    `ObjectStorage`. Launchers and the monitor hold one and never ask which."""

    def probe(self) -> None: ...  # can this process use it? StoreError saying why (before a run is created there)
    def new_place(self, run_id: str, spec_yaml: bytes) -> RunPlace: ...
    def named(self, run_id: str, recorded: Any) -> RunPlace | None: ...  # exactly what `new_place` records, or None
    def expected(self, run_id: str) -> str: ...  # where `new_place` puts run_id's place (said when one is refused)


class SharedFolder:
    """A folder both sides mount (or this machine's own, for the local cluster): each run place a folder in it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def probe(self) -> None:
        """Created (with its parents) and a file written in it and removed: StoreError saying why, before a run is
        created there (a folder that cannot be created once gave a traceback and left a `pending` run behind)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = f".ortlab-probe-{secrets.token_hex(6)}"
            safeio.write_bytes(self.path, probe, b"")
            safeio.remove(self.path, probe)
        except OSError as e:
            raise StoreError(f"cannot create and write the storage folder {self.path}: {e.strerror or e}") from None

    def new_place(self, run_id: str, spec_yaml: bytes) -> RunPlace:
        storage = self.path.resolve()  # (what the job is given, and what `named` compares with)
        storage.mkdir(parents=True, exist_ok=True)
        remote = RunDir(storage / run_id)
        while True:
            try:
                remote.path.mkdir()
                break
            except FileExistsError:
                remote = RunDir(storage / f"{run_id}-{secrets.token_hex(3)}")
        (remote.path / "logs").mkdir()
        (remote.path / "control").mkdir()
        safeio.write_bytes(remote.path, "spec.yaml", spec_yaml)
        remote.set_status("pending")
        return remote

    def named(self, run_id: str, recorded: Any) -> RunPlace | None:
        """Exactly what `new_place` records (the storage's real path, then the name), and not a link: no `..`, no
        relative path (relative to whose folder?), nothing a link could move elsewhere."""
        if not isinstance(recorded, str):
            return None
        path = Path(recorded)
        if not _made_for(run_id, path.name) or recorded != str(self.path.resolve() / path.name):
            return None
        return None if path.is_symlink() else RunDir(path)

    def expected(self, run_id: str) -> str:
        return str(self.path / run_id)


class ObjectStorage:
    """A folder of an object store (`objstore.Store`): each run place a stored run below it."""

    def __init__(self, store: Store):
        self.store = store

    def __str__(self) -> str:
        return self.store.uri

    def probe(self) -> None:
        """An object written, read back and removed."""
        self.store.probe()

    def new_place(self, run_id: str, spec_yaml: bytes) -> RunPlace:
        store = self.store.child(run_id)
        while store.exists("spec.yaml"):
            store = self.store.child(f"{run_id}-{secrets.token_hex(3)}")
        stored = StoredRun(store)
        stored.create(spec_yaml)
        return stored

    def named(self, run_id: str, recorded: Any) -> RunPlace | None:
        """Exactly the URI `new_place` records: this store's child of a name made for the run, its options too."""
        if not isinstance(recorded, str):
            return None
        name = recorded.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        if _made_for(run_id, name) and self.store.child(name).uri == recorded:
            return StoredRun(self.store.child(name))
        return None

    def expected(self, run_id: str) -> str:
        return self.store.child(run_id).uri  # (the run id in the URI's path, before its options)


def storage_at(storage: str | os.PathLike | Store | RunStorage) -> RunStorage:
    """A storage as a spec names it (an object store's URI, or a folder), or as a caller holds it (a `Store`, a
    `Path`, a storage already)."""
    if isinstance(storage, Store):
        return ObjectStorage(storage)
    if isinstance(storage, (str, os.PathLike)):
        return ObjectStorage(Store(str(storage))) if is_uri(storage) else SharedFolder(storage)
    return storage


def probe_storage(storage: str | os.PathLike | Store | RunStorage) -> None:
    """Can this process use `storage`? StoreError saying why (see each kind's `probe`)."""
    storage_at(storage).probe()


def cluster_probe(storage: str | os.PathLike | None) -> str | None:
    """What a job on the cluster is given to probe `target.storage` from its side (`python -m ortlab.job doctor
    --storage`): an object store's URI (its credentials there may differ from this machine's); None for a folder,
    which the job trains in and says so when it cannot. Read from the spec's words, no store opened: the workbench
    asks the cluster's doctor whenever its target changes."""
    return str(storage) if is_uri(storage) else None


def place_at(where: str | os.PathLike) -> RunPlace:
    """The run place a path or URI names (what a job's command line or a status records)."""
    return StoredRun(Store(str(where))) if is_uri(where) else RunDir(where)


def folder_here(place: RunPlace) -> RunDir | None:
    """The folder a job on this node can train `place` in directly (a folder both sides mount), or None: the
    place is not a folder here (an object store), and the job trains in a node-local copy (`job.mirror.Mirror`)."""
    return place if isinstance(place, RunDir) else None


# The secret a launch shares between a local run folder (its control/, mode 0600) and the remote place it made (its
# root): how `place_in` tells the place made for this folder from one a planted folder's status points at.
PLACE_TOKEN = "control/place-token"
ORIGIN = "origin"


def bind(place: RunPlace, run: RunDir) -> None:
    """Bind the new remote `place` to the local `run` that launched it: a fresh secret in both."""
    token = secrets.token_hex(16).encode()
    if isinstance(place, StoredRun):
        place.store.write_bytes(ORIGIN, token)
    else:
        safeio.write_bytes(place.path, ORIGIN, token, durable=True, mode=0o600)
    safeio.write_bytes(run.path, PLACE_TOKEN, token, durable=True, mode=0o600)


def bound(place: RunPlace, run: RunDir) -> bool:
    """Was `place` made by `run`'s launch (`bind`)? False when either side's secret is missing or unreadable."""
    try:
        mine = safeio.read_bytes(run.path, PLACE_TOKEN, limit=64)
        theirs = place.read_small(ORIGIN)
    except (OSError, StoreError):
        return False
    return len(mine) == 32 and hmac.compare_digest(mine, theirs)


def new_place(storage: str | os.PathLike | Store | RunStorage, run_id: str, spec_yaml: bytes) -> RunPlace:
    """A new run place for `run_id` in `storage`, holding the spec and a `pending` status: `<storage>/<run id>`,
    or `<run id>-<6 hex>` when that is taken (run ids are unique in their runs folder, not in a storage that runs
    from several folders share)."""
    return storage_at(storage).new_place(run_id, spec_yaml)


def place_in(storage: str | os.PathLike | Store | RunStorage, run: RunDir, recorded: Any) -> RunPlace | None:
    """The run place `recorded` names, if `run`'s launch made it in `storage` (where `new_place` puts it, and bound
    to `run` by `bind`), else None. A status is a file of the run folder, and a folder may come from anyone: a
    planted path naming another folder would have a resume claim it and the monitor bring its files home; a
    planted folder named as one of the user's runs, in a storage the user listed, names exactly where that run's
    place is, and only the secret tells them apart."""
    place = storage_at(storage).named(run.id, recorded)
    return place if place is not None and bound(place, run) else None


def _made_for(run_id: str, name: str) -> bool:
    return re.fullmatch(re.escape(run_id) + r"(-[0-9a-f]{6})?", name) is not None


# --- bringing a run home -----------------------------------------------------------------------------------------


class NothingThere(StoreError):
    """The run place holds no run any more (its bucket or prefix deleted, its folder removed)."""


def bring_home(remote: RunPlace, run: RunDir) -> list[str]:
    """model/, result.json, tune.json and the last whole checkpoint, from `remote` into the local run folder.
    Returns what was left behind, as "what (why)", for the caller's log.

    Nothing is lost on the way. A folder is downloaded into a staging folder inside the run folder and swapped in
    only when whole; a checkpoint only when its trainer_state.json parses. A local checkpoint or model is never
    removed because the remote has none, an empty one, or failed half-way. A remote that holds no run at all (a
    deleted bucket or prefix) raises NothingThere, the local folder unchanged. Each part is on its own: an odd
    result.json does not keep the model from coming home.
    """
    if remote.read_status().get("state") == "missing" and not remote.has("model"):
        raise NothingThere(
            f"{remote.path} holds no run any more (no status.json, no model: its bucket, prefix or folder was "
            f"deleted?); nothing was brought home and {run.path} is unchanged"
        )
    left: list[str] = []
    for name in ("result.json", "tune.json"):
        try:
            data = remote.read_small(name)
        except FileNotFoundError:
            continue
        except OSError as e:  # TooLarge, a link in a shared folder, a read that failed
            left.append(f"{name} ({type(e).__name__}: {e})")
            continue
        safeio.write_bytes(run.path, name, data, durable=True)
    if remote.has("model"):
        left += _fetch_whole(remote, "model", run, "model", lambda staged: any(staged.iterdir()))
    last = remote.last_checkpoint_name()
    if last is not None:
        where = f"checkpoints/{last}"
        left += _fetch_whole(remote, where, run, where, _checkpoint_complete)
        if run.last_checkpoint_name() == last:  # the newest is here, whole: older ones are not needed for a resume
            for old in run.checkpoints.iterdir():
                if old.name != last and not old.is_symlink():
                    shutil.rmtree(old, ignore_errors=True)
    return left


def _fetch_whole(remote: RunPlace, rel: str, run: RunDir, dest: str, whole: Any) -> list[str]:
    """`remote`'s `rel` into `run.path/dest`, through a staging folder: swapped in when `whole(staged)` says it is,
    else left out (and said)."""
    staging = f".incoming-{secrets.token_hex(4)}"
    staged = run.path / staging / "part"
    try:
        try:
            left = remote.fetch(rel, run.path, f"{staging}/part")
        except Exception as e:  # a download cut half-way, a vanished object
            return [f"{rel} (the download failed: {type(e).__name__}: {e}; the local copy is kept)"]
        if not staged.is_dir() or not whole(staged):
            return [f"{rel} (not whole where it is stored; the local copy is kept)"]
        _swap_in(staged, run.path / dest)
        return left
    finally:
        shutil.rmtree(run.path / staging, ignore_errors=True)


def _swap_in(staged: Path, final: Path) -> None:
    """`staged` becomes `final`; what was at `final` (a folder, or a link: moved, never followed) is removed
    only after that."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(f".{final.name}.old-{secrets.token_hex(4)}")
    had = os.path.lexists(final)
    if had:
        os.rename(final, old)
    os.rename(staged, final)
    if had:
        if old.is_symlink() or not old.is_dir():
            with contextlib.suppress(OSError):
                old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
