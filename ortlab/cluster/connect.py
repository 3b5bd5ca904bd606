"""Connecting to a Ray cluster (this machine's head, `ray start`, KubeRay, Anyscale): which addresses the user's
Ray token may go to, where the token comes from, and `connect`, which turns the usual failures into errors that say
what to do (unreachable address, missing or wrong token, Ray not installed)."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ortlab.addresses import credentials_problem, is_loopback, origin
from ortlab.cluster.record import CONNECT_TIMEOUT_S, INSTALL_HINT, LOCAL, ClusterError, status, token_path

# Addresses (comma- or space-separated) of the Ray clusters this machine's user trusts with their Ray token.
ADDRESSES_ENV = "ORTLAB_RAY_ADDRESSES"
# Set to 1 to send the token over plain http to an address that is not this machine (it then travels in clear).
ALLOW_HTTP_ENV = "ORTLAB_RAY_ALLOW_HTTP"


def configured_addresses() -> list[str]:
    """The cluster addresses the user named in $ORTLAB_RAY_ADDRESSES: the ones a token may go to unasked."""
    return [a for a in os.environ.get(ADDRESSES_ENV, "").replace(",", " ").split() if a]


def is_configured(cluster: str) -> bool:
    """May the user's Ray token go to `cluster` without the user naming it for this very call?

    'local' (the head `ortlab cluster start` started, from its record on this machine) and the addresses in
    $ORTLAB_RAY_ADDRESSES. Not an address read from a run folder: a planted spec.yaml could name any server, and
    the token would be sent there as `Authorization: Bearer`.
    """
    if cluster == LOCAL:
        return True
    wanted = origin(cluster)
    return wanted is not None and any(origin(a) == wanted for a in configured_addresses())


def resolve_address(cluster: str) -> str:
    """The Jobs API address of `cluster` ('local' = the head `ortlab cluster start` started)."""
    if cluster == LOCAL:
        record = status()
        if not record["running"]:
            raise ClusterError(
                "target.cluster is 'local' but no local Ray head is running: start one with `ortlab cluster start`"
            )
        return record["address"]
    return cluster


def token_for(cluster: str, trusted: bool = False) -> tuple[str | None, str]:
    """(token, where it came from) for `cluster`: the local head's token file; else Ray's own sources in Ray's
    order: $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token.

    The user's own token is given only for an address the user named: `trusted` (the caller has it from the user,
    e.g. the spec passed to `launch`) or one in $ORTLAB_RAY_ADDRESSES; for any other, (None, why not).
    """
    if cluster == LOCAL:
        path = token_path()
        return (path.read_text().strip() if path.is_file() else None), f"the local head's token file {path}"
    if not (trusted or is_configured(cluster)):
        return None, (
            f"withheld: {cluster} is not an address you named (ortlab sends your Ray token only to 'local', the "
            f"addresses in ${ADDRESSES_ENV}, or an address you pass to launch or resume yourself)"
        )
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file():
        return path.read_text().strip(), f"the token file {path}"
    return None, "none found ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"


def ray_command(cluster: str, *args: str) -> str:
    """A `ray` CLI command for `cluster` that works as printed: with the address (the CLI has no 'local'), and for
    the local head its token file and token mode (Ray's CLI sends a token only with $RAY_AUTH_MODE=token, and reads
    it from $RAY_AUTH_TOKEN_PATH). Only printed for the user; the test runs it as printed."""
    import shlex

    try:
        address = resolve_address(cluster)
    except ClusterError:  # the local head is not running: nor is any job of it, and there is nothing to address
        return "(no command needed: the local Ray head is not running, and its jobs ended with it)"
    words = ["ray", *args[:2], "--address", address, *args[2:]]
    command = " ".join(shlex.quote(w) for w in words)
    if cluster == LOCAL:
        command = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={shlex.quote(str(token_path()))} {command}"
    return command


def stop_job(cluster: str, job: str, client: Any = None) -> str | None:
    """Stop `job` on `cluster`, through `client` or a new connection (the caller vouches for the address: the user's
    token goes there). None when it was stopped, else why not and the `ray` command that stops it by hand."""
    try:
        (client or connect(cluster, trusted=True)).stop_job(job)
    except Exception as e:
        return f"({type(e).__name__}: {e}); stop it with `{ray_command(cluster, 'job', 'stop', job)}`"
    return None


def check_transport(address: str) -> None:
    """Refuse to send a token over plain http to another machine unless the user opted in ($ORTLAB_RAY_ALLOW_HTTP=1).

    Over http the `Authorization` header travels in clear: anyone on the path can read the token and then run any
    code on the cluster. Loopback (the local head, an SSH tunnel's end) never leaves this machine.
    """
    where = origin(address)
    if where is None or where[0] != "http" or is_loopback(where[1]):
        return
    if os.environ.get(ALLOW_HTTP_ENV, "").strip().lower() in ("1", "true", "yes"):
        return
    raise ClusterError(
        f"the Ray cluster at {address} is reached over plain http, so your Ray token would travel in clear to "
        f"{where[1]} (anyone on the network path could read it and run code on the cluster). Use an https address, "
        f"or an SSH tunnel to 127.0.0.1; to send it in clear anyway, set {ALLOW_HTTP_ENV}=1"
    )


def connect(cluster: str, token: str | None = None, trusted: bool = False) -> Any:
    """A `ray.job_submission.JobSubmissionClient` for `cluster`, checked to answer and to accept our token.

    Fails fast (CONNECT_TIMEOUT_S) with what to do: Ray missing, address unreachable, authentication refused.
    `trusted`: the user named this address for this call (see `token_for`); a token passed in is always sent.
    """
    problem = credentials_problem(cluster)
    if problem:
        raise ClusterError(f"target.cluster: {problem}")
    address = resolve_address(cluster)
    if not address.startswith(("http://", "https://")):
        raise ClusterError(
            f"target.cluster {cluster!r} is not a Ray Jobs address: give the dashboard's http://HOST:PORT "
            "(default port 8265), or 'local'"
        )
    where = "given"
    if token is None:
        token, where = token_for(cluster, trusted=trusted)
    if token:
        check_transport(address)
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise ClusterError(f"remote runs need Ray, which is not installed: {INSTALL_HINT}") from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # A plain request first: it fails in seconds where Ray's client would retry, and it shows the HTTP status.
    request = urllib.request.Request(address.rstrip("/") + "/api/jobs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S):
            pass
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            problem = "no token was sent" if not token else "the token was refused"
            raise ClusterError(
                f"the Ray cluster at {address} refused the request: an authentication problem ({problem}; token "
                f"source: {where}). Put the cluster's token in $RAY_AUTH_TOKEN or the file $RAY_AUTH_TOKEN_PATH "
                "(for 'local': `ortlab cluster start` makes it)"
            ) from None
        raise ClusterError(f"the Ray cluster at {address} answered HTTP {e.code}: is it a Ray dashboard?") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ClusterError(
            f"the Ray cluster at {address} is unreachable ({reason}); check the address (the dashboard's port, "
            "default 8265) and that the cluster is up"
        ) from None
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)  # Ray's own warnings go to the run's log, not the screen
    try:
        return JobSubmissionClient(address, headers=headers)
    except Exception as e:  # (Ray's client reads the server's version first: a KeyError from another server)
        raise ClusterError(
            f"the server at {address} answered, but not as a Ray dashboard ({type(e).__name__}: {e}); check the "
            "address (the dashboard's port, default 8265)"
        ) from None
