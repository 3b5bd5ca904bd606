"""Network addresses that may receive a secret: credentials refused, origins compared, loopback recognised.

A Ray Jobs address (`target.cluster`) is stored in spec.yaml and status.json and written to the run's log, and it
is where ortlab sends the user's Ray token. Three small facts decide whether that is safe, and the spec (which
refuses an address that carries a credential) and the launcher (which decides whether a token may go there) must
agree on them, so they live here, below both. Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import parse_qsl, unquote, urlsplit

# Query or fragment keys that carry a secret in the usual URL conventions (token=, access_token=, api_key=, ...).
_SECRET_KEY = re.compile(r"(token|key|secret|pass(word)?|auth|credential|session|signature|sig)", re.IGNORECASE)


def credentials_problem(address: str) -> str | None:
    """Why `address` must not be stored or used (it carries a credential), or None. Never quotes the credential.

    A `user:password@` part or a token-like query or fragment would be written to spec.yaml, status.json and the
    run's log, and travel in every URL a library logs. The Ray token goes in $RAY_AUTH_TOKEN (or the file
    $RAY_AUTH_TOKEN_PATH) instead, which ortlab sends as a header and never writes anywhere.
    """
    try:
        parts = urlsplit(address)
    except ValueError:
        return None  # not a URL at all: the caller's own check says what an address looks like
    fix = "put the Ray token in $RAY_AUTH_TOKEN (or the file $RAY_AUTH_TOKEN_PATH) instead"
    if "@" in parts.netloc:
        return (
            "the address carries credentials (a user:password@ part), which would be stored in spec.yaml, "
            f"status.json and the run's log: give http(s)://HOST:PORT without it, and {fix}"
        )
    for text in (parts.query, parts.fragment):
        for key, _ in parse_qsl(text, keep_blank_values=True):
            if _SECRET_KEY.search(key):
                return (
                    f"the address carries a credential in its query or fragment ({key}=...), which would be stored "
                    f"in spec.yaml, status.json and the run's log: give http(s)://HOST:PORT without it, and {fix}"
                )
    return None


def origin(address: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) address, with the scheme's default port filled in; None if it is not one.

    Two spellings of one server (`HTTP://Host:80/`, `http://host`) compare equal; anything else does not.
    """
    try:
        parts = urlsplit(address.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def is_loopback(host: str) -> bool:
    """Is `host` this machine only (127.0.0.0/8, ::1, `localhost`)? Traffic to it never leaves the machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# Object stores a cluster run's storage may be (`target.storage`), through pyarrow's file systems. A plain path (or
# file://) is a folder both sides mount; any other scheme is refused by name rather than guessed at.
STORAGE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs")


def storage_scheme(storage: str) -> str | None:
    """The object-store scheme of `storage` (`s3`, `gs`, ...), or None for a folder (a path, or file://)."""
    scheme = urlsplit(storage).scheme.lower() if "://" in storage else ""
    return None if scheme in ("", "file") else scheme


def storage_folder(storage: str) -> str:
    """A folder storage as the plain path it names: `file:///shared/runs` is `/shared/runs` (taken literally, it
    would be a folder named `file:` under the working directory). Object-store URIs are returned unchanged."""
    if storage[:7].lower() == "file://":
        return urlsplit(storage).path
    return storage


def _azure_container(scheme: str, netloc: str) -> bool:
    """Is `netloc` Azure's `container@account[.dfs.core.windows.net]`, the way abfs(s) URIs name a container (an '@'
    that carries no credential), rather than a `user:password@` part?"""
    container, _, account = netloc.partition("@")
    return scheme in ("abfs", "abfss") and bool(container and account) and ":" not in container and "@" not in account


def plain_segments(path: str) -> tuple[str, ...] | None:
    """The segments of a store URI's path, percent-decoded (`%2e%2e` is '..' to the store's client), or None when
    one is empty, '.', '..' or holds an encoded '/': the client resolves those to another place."""
    path = path.removeprefix("/").rstrip("/")
    segments = tuple(unquote(s) for s in path.split("/")) if path else ()
    return None if any(s in ("", ".", "..") or "/" in s for s in segments) else segments


def storage_problem(storage: str) -> str | None:
    """Why `storage` cannot be a run's storage (an unknown scheme, a credential in it, a path that does not say
    plainly where it goes), or None. Never quotes the credential: object-store credentials come from the
    environment of each side (AWS_ACCESS_KEY_ID, a GCP service account, ...), because the URI is written to
    spec.yaml, status.json, the job's command line and the logs."""
    scheme = storage_scheme(storage)
    if scheme is None:
        if storage[:7].lower() == "file://":
            parts = urlsplit(storage)
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                return "a file:// storage must name a folder on this machine: file:///shared/runs, or just /shared/runs"
            if parts.query or parts.fragment:
                return "a file:// storage takes no ?query or #fragment: give the folder alone, e.g. /shared/runs"
        return None
    if scheme not in STORAGE_SCHEMES:
        return (
            f"{scheme}:// is not a storage ortlab knows: give a folder both sides mount, or a URI with one of "
            + ", ".join(f"{s}://" for s in STORAGE_SCHEMES)
        )
    parts = urlsplit(storage)
    fix = "each side takes its credentials from its own environment (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
    if "@" in parts.netloc and not _azure_container(scheme, parts.netloc):
        return f"the storage URI carries credentials (a user:password@ part), which would be written down; {fix}"
    if not parts.netloc:
        return f"the storage URI names no bucket: give {scheme}://BUCKET/PREFIX"
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_KEY.search(key):
            return f"the storage URI carries a credential in its query ({key}=...), which would be written down; {fix}"
        # endpoint_override=http://user:password@host, and the same without a scheme (`user:password@host`, which
        # urlsplit reads as scheme `user` and no host): no option of a store's client takes an '@'.
        if "@" in value:
            return (
                f"the storage URI's option {key} carries credentials (a user:password@ part), which would be "
                f"written down; {fix}"
            )
    if parts.fragment:
        return "the storage URI has a #fragment, which no object store reads: leave it out"
    # The store's client resolves '.', '..' and empty segments (s3://allowed/runs/../../other/x is another bucket's
    # key): a URI must say plainly where the run goes, so that comparing it with the allowed stores means something.
    if plain_segments(parts.path) is None:
        return (
            "the storage URI's path has an empty, '.' or '..' segment, which the store's client resolves to "
            f"another place: write the prefix plainly, e.g. {scheme}://BUCKET/runs"
        )
    return None
