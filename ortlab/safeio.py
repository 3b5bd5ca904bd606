"""Files in folders ortlab does not control: opened without following links, read with a bound, JSON always valid.

A run folder can come from anywhere: copied from a colleague, cloned with a repository, unpacked from an archive.
Once a browser button (the sidebar's Stop and Resume) acts on every folder under the runs root, such a folder is
untrusted input, and three ordinary habits become holes:

- `path.write_text()` follows a symbolic link: a planted `control/stop -> ~/.bashrc` makes Stop overwrite it, and a
  link to a private key in `model/` makes publishing upload it. Here every component below the folder is opened
  with `O_NOFOLLOW` (relative to the folder's own descriptor, `openat`-style), so a link anywhere below the folder
  raises `UnsafePath` instead of being followed; the folder itself is the caller's to resolve (see
  `ortlab.runfolder.naming.run_folder`). Only regular files are read: a FIFO would block a reader forever, a device
  never ends.
- `path.read_text()` reads a whole file: a 171 MiB metrics file took a Jupyter server from 103 MB to 1.69 GB.
  Every read here has a limit and raises `TooLarge` past it.
- `json.dumps` writes `NaN` and `Infinity` by default, which are not JSON: one diverged run's `final_loss` made the
  server's answers unparseable for the browser. `dumps` cleans non-finite numbers at every depth to `null`.

Writes never go into an existing file: a new file is written beside it and renamed over it (a rename replaces a link
itself, never its target), so even a hard link planted in a folder cannot carry a write elsewhere.

This module is the bottom layer: it imports only the standard library.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Any

from ortlab.errors import OrtlabError

# One JSON document ortlab writes into a run folder (status, result, spec) is a few KiB; anything near this is not one.
MAX_JSON_BYTES = 8 * 1024 * 1024
READ_PIECE = 64 * 1024

# A whole number in a name or a value from outside (a checkpoint folder's suffix, a query's offset, a label): ASCII
# digits only. `str.isdigit` says yes to '²' and '٣', which `int` refuses ('²') or reads ('٣' is 3): each a traceback
# or a surprise (issue #48).
_ASCII_INT = re.compile(r"-?[0-9]{1,18}")


def ascii_int(text: str, signed: bool = False) -> int | None:
    """`text` as an int when it is ASCII digits (at most 18, a leading '-' if `signed`), else None."""
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text) or (text.startswith("-") and not signed):
        return None
    return int(text)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OrtlabError, OSError):
    """A path below a folder is a link, escapes the folder, or is not a regular file where one was expected."""


class TooLarge(OrtlabError, OSError):
    """A file is larger than the limit its reader allows."""


def real_number(value: Any) -> float | None:
    """`value` as a finite float, or None: for a bool, a non-number, NaN, +-inf, and an int too large for a float
    (JSON allows `1e400`-sized integers; `math.isfinite` raises OverflowError on them). Every view of a run's numbers
    draws or prints through this, so one damaged record leaves a point out instead of failing the view."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, +-inf) replaced by None, at every depth; tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that always produces valid JSON: non-finite numbers become null (see `finite`)."""
    kwargs.setdefault("default", str)
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def _parts(rel: str | os.PathLike) -> tuple[str, ...]:
    parts = PurePosixPath(os.fspath(rel)).parts
    if not parts or parts[0] == "/" or any(p in ("..", ".") for p in parts):
        raise UnsafePath(errno.EINVAL, f"{os.fspath(rel)!r} is not a plain relative path inside the folder")
    return parts


@contextmanager
def _parent_fd(folder: str | os.PathLike, parts: tuple[str, ...], create: bool = False) -> Iterator[int]:
    """A descriptor of the directory holding `parts[-1]`, every step below `folder` taken without following links."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(
                        e.errno,
                        f"{'/'.join(parts[: i + 1])} in {os.fspath(folder)} is a link or "
                        "not a folder; ortlab does not follow links inside a run folder",
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _link_error(folder: str | os.PathLike, rel: str | os.PathLike, e: OSError) -> OSError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafePath(
            e.errno,
            f"{os.fspath(rel)} in {os.fspath(folder)} is a link; ortlab does not follow links inside a run folder",
        )
    return e


def open_in(folder: str | os.PathLike, rel: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A file descriptor for `folder/rel`, opened without following a link at any step below `folder`.

    Reads (no O_CREAT) must land on a regular file: anything else raises UnsafePath before a byte is read.
    The caller closes the descriptor (or wraps it with `os.fdopen`).
    """
    parts = _parts(rel)
    with _parent_fd(folder, parts, create=bool(flags & os.O_CREAT)) as dfd:
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dfd)
        except OSError as e:
            raise _link_error(folder, rel, e) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(errno.EINVAL, f"{os.fspath(rel)} in {os.fspath(folder)} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_bytes(folder: str | os.PathLike, rel: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole of a small file in `folder`, never following a link; TooLarge past `limit` bytes.

    Read in pieces: `read(limit + 1)` would allocate the whole limit (8 MiB by default) for every 2 KiB status file.
    """
    data = _read_fd(open_in(folder, rel), limit)
    if data is None:
        raise TooLarge(errno.EFBIG, f"{os.fspath(rel)} in {os.fspath(folder)} is larger than {limit} bytes")
    return data


def read_named_file(path: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> bytes:
    """A small file the user named (a spec on the command line, a path given to `launch`): links are followed (the
    path is the user's own), but it must be a regular file (a FIFO or a device would hang or never end) of at most
    `limit` bytes (UnsafePath, TooLarge), and a missing one is FileNotFoundError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(errno.EINVAL, f"{os.fspath(path)} is not a regular file")
    os.set_blocking(fd, True)
    data = _read_fd(fd, limit)
    if data is None:
        raise TooLarge(errno.EFBIG, f"{os.fspath(path)} is larger than {limit} bytes")
    return data


def _read_fd(fd: int, limit: int) -> bytes | None:
    """Everything `fd` holds, closing it; None once it holds more than `limit` bytes (read no further)."""
    pieces, size = [], 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        while size <= limit:
            piece = f.read(min(READ_PIECE, limit + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
    return None if size > limit else b"".join(pieces)


def read_json(folder: str | os.PathLike, rel: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file in `folder` (no links, at most `limit` bytes). Raises OSError or ValueError when it is not one
    (nested deeper than the parser recurses included: a few KB of '[' is a RecursionError to `json.loads`)."""
    data = read_bytes(folder, rel, limit)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{os.fspath(rel)} is nested too deep to be ortlab's") from None


def write_bytes(
    folder: str | os.PathLike, rel: str | os.PathLike, data: bytes, durable: bool = False, mode: int = 0o644
) -> None:
    """Replace `folder/rel` with `data`, atomically: a new file beside it renamed over it, no link followed.

    `durable` fsyncs the file and its folder, so a power cut leaves the old or the new content, never half.
    `mode` is the new file's from its creation (0o600 for a secret: never readable by others, even for an instant).
    """
    write_pieces(folder, rel, [data], durable=durable, mode=mode)


def write_pieces(
    folder: str | os.PathLike, rel: str | os.PathLike, pieces: Iterable[bytes], durable: bool = False, mode: int = 0o644
) -> None:
    """`write_bytes` for a file that comes in pieces (a model downloaded from an object store): memory for one
    piece, not for the file."""
    parts = _parts(rel)
    with _parent_fd(folder, parts, create=True) as dfd:
        tmp = f".{parts[-1]}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                for piece in pieces:
                    f.write(piece)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            with suppress(OSError):
                os.fsync(dfd)


def write_json(folder: str | os.PathLike, rel: str | os.PathLike, value: Any, durable: bool = True) -> None:
    """Write `value` as valid JSON (see `dumps`: a NaN loss is null) into `folder/rel`, atomically and without
    following links: readers never see half a file, and with `durable` (file and folder fsynced) a crash leaves the
    old or the new one. ortlab's one JSON writer (status.json, result.json, caches, the cluster's record)."""
    write_bytes(folder, rel, dumps(value, indent=2).encode("utf-8"), durable=durable)


def remove(folder: str | os.PathLike, rel: str | os.PathLike) -> bool:
    """Remove `folder/rel` (a link is removed itself, never its target); False when it was not there."""
    parts = _parts(rel)
    try:
        with _parent_fd(folder, parts) as dfd:
            os.unlink(parts[-1], dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True


def exists(folder: str | os.PathLike, rel: str | os.PathLike) -> bool:
    """Is there an entry (of any kind, a link included) at `folder/rel`, reached without following links?"""
    parts = _parts(rel)
    try:
        with _parent_fd(folder, parts) as dfd:
            os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
    except (FileNotFoundError, UnsafePath, NotADirectoryError):
        return False
    return True


def is_regular(path: str | os.PathLike) -> bool:
    """Is `path` itself a regular file (a link to one is not)?"""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


_ELSE = ": remove it (or, for a temporary folder, set TMPDIR to a folder of your own)"


def private_folder(path: str | os.PathLike) -> Path:
    """`path`, a folder only this user can enter (mode 0700): created so, or, if it is already there, used only when
    it is a real folder (not a link) of this user's that nobody else could write into (it is then made 0700).

    For a folder with a known name in a place every user shares (/tmp): another user may have made it first, or
    planted a link there, or a folder that they can write to; any of those raises UnsafePath (naming the path, to
    remove) rather than putting this user's files where others can read or replace them."""
    path = Path(path)
    with suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(e.errno, f"{path} is a link or not a folder, so it is not used{_ELSE}") from None
        raise
    try:
        info = os.fstat(fd)
        why = None
        if info.st_uid != os.getuid():
            why = f"belongs to another user (uid {info.st_uid})"
        elif info.st_mode & 0o022:  # others could have put links or files of theirs in it
            why = f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
        if why is not None:
            raise UnsafePath(errno.EPERM, f"{path} {why}, so it is not used{_ELSE}")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def regular_files(folder: str | os.PathLike) -> Iterator[Path]:
    """Every regular file below `folder`, never descending into a linked folder; links and special files skipped.

    For copying a folder somewhere others can read it (publishing, bringing results home): only what is really in
    the folder goes, never what a link points at.
    """
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if is_regular(path):
                yield path


def not_regular(folder: str | os.PathLike, rel: str | os.PathLike) -> list[str]:
    """What below `folder/rel` is not a regular file or a real folder (links to files or folders, FIFOs, devices,
    sockets), as "path (why)" relative to `folder`; `rel` itself counts. Empty when `folder/rel` does not exist.

    For a library that will open the folder by path and follow whatever it finds (transformers' `from_pretrained`):
    check first, refuse what is not the folder's own. A look, not a lock: it answers for a folder that sits still
    (a planted one), not against someone changing it meanwhile, who could write the files themselves."""
    top = Path(folder, *_parts(rel))
    found: list[str] = []

    def why(path: Path) -> str | None:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:  # (gone since it was listed: nothing to load)
            return None
        if stat.S_ISLNK(mode):
            return "a link"
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return "not a regular file"
        return None

    if (bad := why(top)) is not None:
        return [f"{PurePosixPath(*_parts(rel))} ({bad})"]
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath, name)
            if (bad := why(path)) is not None:
                found.append(f"{path.relative_to(folder).as_posix()} ({bad})")
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
    return found


def copy_files(
    folder: str | os.PathLike,
    rel: str | os.PathLike,
    dest: str | os.PathLike,
    select: Callable[[PurePosixPath], bool] | None = None,
    descend: bool = True,
) -> list[str]:
    """Copy the regular files below `folder/rel` into `dest` (same layout); returns what was skipped, and why.

    For copying out of a folder ortlab does not control (publishing a run, bringing a remote run home): every
    directory and file is opened relative to its parent's descriptor without following a link, so nothing outside
    `folder` is copied, even if a link is swapped in during the copy. Links, FIFOs, devices and sockets are not
    copied; each appears in the returned list as "path (why)", paths relative to `folder`, for the caller to say.
    `select(path relative to folder/rel)` picks files; what it leaves out is not reported (that was the intent),
    and neither are subfolders when `descend` is False (only the files directly in `folder/rel` are looked at).
    FileNotFoundError when `folder/rel` does not exist.
    """
    base = PurePosixPath(*_parts(rel))
    skipped: list[str] = []
    try:
        with _parent_fd(folder, base.parts) as parent:
            top = os.open(base.parts[-1], _DIR_FLAGS, dir_fd=parent)
    except UnsafePath:
        return [f"{base} (a link on the way to it)"]
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return [f"{base} (a link or not a folder)"]
        raise
    try:
        _copy_dir(top, base, PurePosixPath(), Path(dest), select, skipped, descend)
    finally:
        os.close(top)
    return skipped


def _copy_dir(
    dfd: int,
    base: PurePosixPath,
    sub: PurePosixPath,
    dest: Path,
    select: Callable[[PurePosixPath], bool] | None,
    skipped: list[str],
    descend: bool = True,
) -> None:
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = sub / entry.name
        shown = base / rel
        if entry.is_symlink():
            if select is None or select(rel):
                skipped.append(f"{shown} (a link)")
        elif entry.is_dir(follow_symlinks=False):
            if not descend:
                continue
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=dfd)
            except OSError:
                skipped.append(f"{shown} (a link or not a folder)")
                continue
            try:
                _copy_dir(child, base, rel, dest, select, skipped, descend)
            finally:
                os.close(child)
        elif not entry.is_file(follow_symlinks=False):
            if select is None or select(rel):
                skipped.append(f"{shown} (not a regular file)")
        elif select is None or select(rel):
            try:
                fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                skipped.append(f"{shown} (a link)")
                continue
            with os.fdopen(fd, "rb") as src:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    skipped.append(f"{shown} (not a regular file)")
                    continue
                os.set_blocking(fd, True)
                target = dest.joinpath(*rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
