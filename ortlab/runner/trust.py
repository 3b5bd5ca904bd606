"""Driver side: which interpreter, Ray address and store a run folder may name: the user's, never the folder's.

A spec given to `launch` is the user's own: its target.python and target.cluster are used as given. The spec in
a run folder may come from anyone (copied, cloned, unpacked, planted in the server's runs root), and resuming it
would otherwise start the program it names and send the user's Ray token to the address it names. So a resumed
run starts only an interpreter the user vouches for on this machine (this one, one of ortlab's runtimes, or one
in $ORTLAB_TRUSTED_PYTHONS) and talks only to an address the user named ('local', or one in
$ORTLAB_RAY_ADDRESSES), or to the interpreter / address named for that resume; and its storage (an object store,
whose requests this machine's credentials sign, or a folder: both hold other runs) is read and written only where
the user listed it in $ORTLAB_STORAGE_URIS or named it in a spec launched in this process. A folder the user
launched carries their mark (`ortlab.runfolder.vouch`) and resumes as launched, none of this asked again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ortlab.addresses import plain_segments, storage_folder, storage_scheme
from ortlab.cluster import ADDRESSES_ENV, is_configured
from ortlab.runner.launcher import RunError
from ortlab.runtimes import RUNTIMES, python_for
from ortlab.spec import RunSpec, SpecError

# Interpreters (absolute paths separated by os.pathsep) a run folder's target.python may name on resume.
TRUSTED_PYTHONS_ENV = "ORTLAB_TRUSTED_PYTHONS"
# Storages (separated by spaces) a run folder's target.storage may name on resume and bring-home: object-store
# URIs, and folders as absolute paths or file:// URIs.
STORAGES_ENV = "ORTLAB_STORAGE_URIS"

# Storages named in specs given to `launch` in this process (the user's own): their runs resume and come home here
# without a listing. Never filled from a run folder.
_named_here: set[str] = set()


def storage_named(storage: str) -> None:
    """Remember that the user named `storage` in this process (a spec given to `launch`, never a run folder's); a
    folder as its real path now (a relative one means the folder it names from here)."""
    _named_here.add(storage if storage_scheme(storage) else str(_real_folder(storage)))


def storage_trusted(storage: str) -> bool:
    """Is `storage` one the user listed in $ORTLAB_STORAGE_URIS (the same place, or one inside a listed one), or
    named in a spec launched in this process?

    An object store: a stored run's monitor signs its requests with this machine's credentials for the store, and
    the endpoint is part of the URI: a folder naming `?endpoint_override=` some server would get requests signed
    with them sent there. Compared after normalisation, segment by segment, with the same options (`%2e%2e` is
    `..`, which the store's client resolves): a URI whose path has an empty, `.` or `..` segment is never inside a
    listed one (`s3://allowed/runs/../../other/x` once passed a prefix comparison and read another bucket).

    A folder: it holds other runs' folders (anyone's who shares it, or the user's other runs folders'), which a
    resume would claim and a bring-home copy. Compared as real paths (links resolved on both sides: where the
    files are is what matters); a listed folder must be absolute."""
    listed = os.environ.get(STORAGES_ENV, "").split()
    if storage_scheme(storage) is None:
        given = _real_folder(storage)
        allowed_folders = [_real_folder(s, listed=True) for s in [*listed, *_named_here] if storage_scheme(s) is None]
        return given is not None and any(a is not None and (given == a or a in given.parents) for a in allowed_folders)
    store = _normalised(storage)
    if store is None:
        return False
    for entry in [*listed, *_named_here]:
        allowed = _normalised(entry) if storage_scheme(entry) else None
        same_store = allowed is not None and store[0] == allowed[0] and store[2] == allowed[2]
        if same_store and store[1][: len(allowed[1])] == allowed[1]:
            return True
    return False


def _real_folder(storage: str, listed: bool = False) -> Path | None:
    """A folder storage as the real path it names (`file:///a%20b` is `/a b`); None for a listed one that is not
    absolute (relative to which folder?)."""
    folder = unquote(storage_folder(storage)) if storage[:7].lower() == "file://" else storage
    if listed and not os.path.isabs(folder):
        return None
    return Path(os.path.realpath(folder))


def _normalised(uri: str) -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]] | None:
    """(scheme://bucket, path segments, sorted options) of a store URI, or None when its path does not say plainly
    where it goes."""
    parts = urlsplit(uri)
    segments = plain_segments(parts.path)
    if segments is None or ("@" in parts.netloc and storage_scheme(uri) not in ("abfs", "abfss")):
        return None  # (abfs names `container@account`: no credential, see addresses.storage_problem)
    options = tuple(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return f"{parts.scheme.lower()}://{parts.netloc}", segments, options


def storage_gate(run_id: str, spec: Any, vouched: bool = False) -> None:
    """The one gate before a run folder's storage, folder or object store, is read or written (resume, with or
    without a cluster named, whose claim writes the remote status; bringing results home; the sidebar's actions,
    which go through these): the storage must be one the user listed or named in this process. RunError saying
    how to allow it. The default storage of `ortlab cluster start`'s head (no target.storage) is ortlab's own
    folder under the user's cluster folder, not one a run folder names."""
    storage = spec.target.storage
    if vouched or not storage or storage_trusted(storage):  # (vouched: the user named it in the launch's spec)
        return
    how = (
        f"If you trust it, list it in ${STORAGES_ENV} (separated by spaces: object-store URIs, folders as absolute "
        "paths or file:// URIs; for the Jupyter server, set it before starting the server)"
    )
    if storage_scheme(storage):
        raise RunError(
            f"run {run_id}: its spec.yaml names the object store {storage!r} (target.storage), and ortlab "
            f"uses your credentials for a store only where you named it (a folder may come from anyone). {how}"
        )
    raise RunError(
        f"run {run_id}: its spec.yaml names the storage folder {storage!r} (target.storage), which holds other "
        "runs' folders, and ortlab reads or writes a storage only where you named it (a run folder may come from "
        f"anyone, and would claim or copy another run's results). {how}"
    )


def python_trusted(python: str) -> bool:
    """Is `python` an interpreter this machine's user vouches for: this one, one of ortlab's runtimes, or one
    listed in $ORTLAB_TRUSTED_PYTHONS?

    Paths are compared as written (made absolute, links not resolved): a venv's `bin/python` is a link to the
    base interpreter, and the same binary started through another folder's link reads that folder's
    `pyvenv.cfg` and site-packages, so "the same file" is not "the same interpreter".
    """
    wanted = os.path.abspath(python)
    known = [sys.executable, *(str(p) for p in map(python_for, RUNTIMES) if p is not None), *trusted_pythons()]
    return any(os.path.abspath(k) == wanted for k in known)


def trusted_pythons() -> list[str]:
    """The interpreters listed in $ORTLAB_TRUSTED_PYTHONS (absolute paths, separated by os.pathsep)."""
    return [p for p in os.environ.get(TRUSTED_PYTHONS_ENV, "").split(os.pathsep) if p.strip()]


def trusted_target(
    run_id: str, spec: Any, python: str | None = None, cluster: str | None = None, vouched: bool = False
) -> Any:
    """The spec a resumed run starts with: its folder's, whose interpreter and cluster address must be ones the
    user vouches for on this machine, or the folder's with the interpreter / address the user names here. A folder
    that carries the user's mark (`vouched`: they launched it, `ortlab.runfolder.vouch`) resumes as launched.

    Why here and not in RunSpec: a spec is the same value whoever wrote it; what differs is who named it.
    """
    target = spec.target
    storage_gate(run_id, spec, vouched)  # naming the cluster (or the interpreter) is not naming the store
    if python is not None or cluster is not None:
        if python is not None and cluster is not None:
            raise RunError("resume: python and cluster exclude each other (a cluster run uses the cluster's python)")
        if python is not None and target.cluster:
            raise RunError(f"run {run_id} runs on the cluster {target.cluster!r}: resume it with cluster=, not python=")
        if cluster is not None and not target.cluster:
            raise RunError(f"run {run_id} runs on this machine: resume it without cluster= (or with python=)")
        data = spec.model_dump(mode="json")
        data["target"]["python" if python is not None else "cluster"] = python if python is not None else cluster
        try:
            return RunSpec.parse(data)
        except SpecError as e:
            raise RunError(str(e)) from None
    if vouched:  # a folder the user launched (runfolder.vouch): its target is the one they named then
        return spec
    if target.python and not python_trusted(target.python):
        raise RunError(
            f"run {run_id}: its spec.yaml names the interpreter {target.python!r} (target.python), and ortlab does not "
            "start a program that a run folder names (a folder may come from anyone). If you trust it, name it "
            f"yourself: `ortlab resume {run_id} --python PATH` or `Run.resume(python=PATH)`, or list it in "
            f"${TRUSTED_PYTHONS_ENV} (absolute paths separated by {os.pathsep!r}; for the Jupyter server, set it "
            "before starting the server)"
        )
    if target.cluster and not is_configured(target.cluster):
        raise RunError(
            f"run {run_id}: its spec.yaml names the Ray cluster {target.cluster!r} (target.cluster), and ortlab sends "
            "your Ray token only to an address you named on this machine ('local', or one listed in "
            f"${ADDRESSES_ENV}). If you trust it, name it yourself: `ortlab resume {run_id} --cluster ADDRESS` or "
            f"`Run.resume(cluster=ADDRESS)`, or list it in ${ADDRESSES_ENV} (for the Jupyter server, set it before "
            "starting the server)"
        )
    return spec
