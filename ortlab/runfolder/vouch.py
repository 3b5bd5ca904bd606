"""Your mark on the run folders you made: a keyed hash that a folder from elsewhere cannot carry.

A run folder may come from anyone (copied, unpacked, planted in a shared runs root), so resuming one gates what
its spec names: the interpreter, the Ray address, the storage, and the Hub downloads made with your token
(`ortlab.runner.trust`). A folder you launched yourself named all of those in your own spec, so its resume should
not ask you again. What tells the two apart is this mark: an HMAC-SHA256, under a key only this user can read
(`cache_dir()/keys/run-folders.key`, made at the first launch, mode 0600 in a 0700 folder), of the folder's real
path and its spec.yaml, written to `control/vouched` when `launch` or `ortlab train` creates the folder.

- A planted folder has no mark, or one copied from a folder of yours: the path differs, so it does not verify.
- A spec.yaml edited after the launch (by anyone) no longer verifies: the folder is gated as a stranger's.
- A folder moved or restored elsewhere, or resumed by another user or machine (another key), is gated too: the
  gates say how to allow what it names. That is the price of a mark that cannot be copied.

What the mark does not cover: status.json and the other files a run writes as it goes (they change all the time).
Whoever can write into your own run folders can do more than this mark could stop.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import warnings
from pathlib import Path

from ortlab import safeio
from ortlab.envvars import cache_dir
from ortlab.runfolder.rundir import SPEC_MAX_BYTES, RunDir

KEY_FILE = "run-folders.key"
MARK_FILE = "control/vouched"
_DOMAIN = b"ortlab run folder, v1\0"


def _keys() -> Path:
    cache_dir().mkdir(parents=True, exist_ok=True)
    return safeio.private_folder(cache_dir() / "keys")


def _key(create: bool) -> bytes | None:
    """This user's key (32 random bytes), made when `create` and missing; None when there is none to read."""
    folder = _keys()
    try:
        key = safeio.read_bytes(folder, KEY_FILE, limit=64)
    except FileNotFoundError:
        if not create:
            return None
        try:  # exclusive: two first launches at once keep one key (the first), never one each
            fd = os.open(folder / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
                os.fsync(f.fileno())
        key = safeio.read_bytes(folder, KEY_FILE, limit=64)
    return key if len(key) == 32 else None


def _digest(key: bytes, run: RunDir) -> str:
    spec = safeio.read_bytes(run.path, "spec.yaml", SPEC_MAX_BYTES)
    place = os.fsencode(os.path.realpath(run.path))
    return hmac.new(key, _DOMAIN + place + b"\0" + spec, hashlib.sha256).hexdigest()


def mark(run: RunDir) -> bool:
    """Mark `run`, a folder this process just created from the user's own spec, as the user's. False, with a
    warning, when the key or the mark cannot be written safely (a cache folder of another user's, a full disk): the
    folder is then gated on resume as a stranger's, which costs a prompt, never a launch."""
    try:
        key = _key(create=True)
        if key is None:
            raise OSError(errno.EINVAL, f"the key in {_keys() / KEY_FILE} is not 32 bytes: remove it (one is made)")
        safeio.write_bytes(run.path, MARK_FILE, _digest(key, run).encode(), durable=True)
    except OSError as e:
        warnings.warn(f"run {run.id} is not marked as yours ({e}): its resume will be gated", stacklevel=2)
        return False
    return True


def marked(run: RunDir) -> bool:
    """Does `run` carry this user's mark for its place and its spec as they are now? False for anything that cannot
    be read as such (no key, no mark, a link, a spec too large): a stranger's folder, gated."""
    try:
        key = _key(create=False)
        if key is None:
            return False
        found = safeio.read_bytes(run.path, MARK_FILE, limit=128).decode("ascii", errors="replace")
        return hmac.compare_digest(found, _digest(key, run))
    except OSError:
        return False
