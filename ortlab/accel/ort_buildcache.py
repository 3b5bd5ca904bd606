"""A cache of ORTModule's compiled C++ extensions, so that a second environment with the same torch, ORT, Python
and compiler copies them in seconds instead of compiling for three minutes.

Compiling the two extensions was 138 s of the 176 s that `scripts/dev setup` took in a fresh clone, repeated for
every clone and every new virtual environment, though the result depends only on what the key below holds: the
versions the extensions are built against (`ortlab.accel.ort._built_for`), the interpreter's ABI, the machine,
the compiler and the extensions' own sources. Anything else in the key's folder is not read.

The cache holds code that every ORT run loads into its process, so it is trusted as far as the user's own cache
is: its folders must be real folders of this user that nobody else can write into (`safeio.private_folder`), and
each file must be a regular file of this user's, not writable by others; otherwise the extensions are compiled as
before. A build is stored under a temporary name and renamed whole, so a killed store leaves no half entry.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ortlab import safeio
from ortlab.envvars import cache_dir

COMPLETE = "complete"  # written last into an entry: an entry without it is not used


def _compiler() -> str:
    for name in ("c++", "g++"):
        path = shutil.which(name)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
            return f"{os.path.realpath(path)} {out.splitlines()[0] if out else ''}"
    return "none"


def key(ext_dir: Path, built_for: str, names: tuple[str, ...]) -> str:
    """What the compiled extensions depend on, hashed: change any part and the cache misses."""
    h = hashlib.sha256()
    for part in (built_for, sys.implementation.cache_tag, platform.machine(), _compiler()):
        h.update(part.encode() + b"\0")
    for name in names:
        src = ext_dir / "cpu" / name
        for f in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(f.relative_to(src).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _root() -> Path:
    base = safeio.private_folder(cache_dir().resolve())
    return safeio.private_folder(base / "ort-extensions")


def _ours(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def restore(ext_dir: Path, entry_key: str, names: tuple[str, ...]) -> bool:
    """Copy a cached build of every extension in `names` into `ext_dir`; False (and nothing copied) on a miss."""
    try:
        entry = _root() / entry_key
        if not entry.is_dir() or entry.is_symlink() or not _ours(entry / COMPLETE):
            return False
        files = [f for f in entry.iterdir() if f.name.endswith(".so")]
        if not all(any(f.name.startswith(n) for f in files) for n in names) or not all(_ours(f) for f in files):
            return False
    except OSError:
        return False
    for f in files:
        shutil.copy2(f, ext_dir / f.name)
    return True


def store(files: list[Path], entry_key: str) -> None:
    """Keep a fresh build for the next environment. Best effort: a cache that cannot be written costs the next
    environment a compile, never this one its build."""
    try:
        root = _root()
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
        for f in files:
            shutil.copy2(f, tmp / f.name)
        (tmp / COMPLETE).write_text("")
        entry = root / entry_key
        if os.path.lexists(entry):  # only a fresh build is stored: the entry there was refused or incomplete
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=root))
            os.rename(entry, stale / "entry")
            shutil.rmtree(stale)
        os.rename(tmp, entry)
    except OSError:
        return
