"""A test double of the Hugging Face Hub: it speaks the Hub's HTTP protocol for the routes ortlab uses.

The real `huggingface_hub` client talks to it over loopback, so tests can push and pull models without a network.
It implements, for model repos only and for the `main` branch only (plus reads by commit sha):

    POST /api/repos/create                                  create_repo (409 when the repo exists)
    POST /api/validate-yaml                                 README.md metadata check made by upload_folder
    GET  /api/models/{repo_id}[/revision/{rev}]             model_info / repo_info / repo_exists
    GET  /api/models/{repo_id}/tree/{rev}[/{path}]          list_repo_tree / list_repo_files / snapshot_download
    POST /api/models/{repo_id}/preupload/{rev}              preupload: "lfs" for weight suffixes, files >= 10 MB
                                                            or a NUL byte in the sample; "regular" otherwise
    POST /{repo_id}.git/info/lfs/objects/batch              LFS batch API ("basic" transfer), hands out upload URLs
    PUT  /lfs-storage/{sha256}?size=..&sig=..               LFS upload (the "S3" side: signed URL, no token)
    POST /api/models/{repo_id}/commit/{rev}                 NDJSON commit: header, file (base64), lfsFile,
                                                            deletedFile, deletedFolder
    HEAD /{repo_id}/resolve/{rev}/{path}                    file metadata: X-Repo-Commit, ETag, X-Linked-Etag,
    GET  /{repo_id}/resolve/{rev}/{path}                    X-Linked-Size, Content-Length; GET adds the bytes

Auth: write routes need `Authorization: Bearer <token>` with the token the server was built with (else 401). A wrong
token is refused everywhere (401, "Invalid credentials in Authorization header"), as on the Hub. Public repos can be
read anonymously; a private repo answers 401 + `X-Error-Code: RepoNotFound` to anyone without the token, so the client
raises `RepositoryNotFoundError`, as with the real Hub.

Differences from the Hub, kept on purpose: a new repo starts empty (no `.gitattributes` commit), files are served
directly instead of redirecting LFS files to a CDN, no Xet, no pull requests, no branches other than `main`.

The client must see these environment variables *before* `huggingface_hub` is imported (its constants are read at
import time), which is why tests run the client in a subprocess:

    HF_ENDPOINT=<FakeHub.url>      where the client sends every request
    HF_HUB_DISABLE_XET=1           use the preupload/LFS protocol, not Xet storage (hf_xet is installed)
    HF_HUB_OFFLINE unset (or 0)    and TRANSFORMERS_OFFLINE unset: tests/conftest.py sets both to 1
    HF_HOME=<tmp dir>              keeps the cache and any stored token out of the user's home
    HF_TOKEN=<token>               optional, the token used when the code does not pass one
    HF_HUB_DISABLE_TELEMETRY=1     recommended: otherwise the client asks {HF_ENDPOINT}/api/agent-harnesses for
                                   its user-agent string (harmless, it gets a 404 here)

Usage:

    with FakeHub(token="hf_test_token") as hub:
        ...  # run the client with HF_ENDPOINT=hub.url
        assert hub.files("user/model")["config.json"] == b"{}"
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

# Files the preupload endpoint sends through LFS: weights and other binaries, like the Hub's default .gitattributes.
LFS_SUFFIXES = (
    ".safetensors",
    ".onnx",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".npy",
    ".npz",
    ".pkl",
    ".gguf",
    ".tflite",
    ".ot",
    ".zip",
    ".tar",
    ".gz",
    ".parquet",
    ".arrow",
)
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub refuses regular (non-LFS) files above 10 MB

_REPO = r"(?P<repo>[\w.-]+(?:/[\w.-]+)?)"  # "namespace/name" or a bare "name"
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_sha(data: bytes) -> str:
    """The git object id of a blob (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        """The git oid: of the content for a regular file, of the pointer file for an LFS file."""
        return git_blob_sha(lfs_pointer(self.sha256, len(self.data)) if self.lfs else self.data)

    @property
    def remote_oid(self) -> str:
        """What preupload reports, and the client compares with its local file: sha256 for LFS, git sha1 otherwise."""
        return self.sha256 if self.lfs else self.blob_id


class HubError(Exception):
    """An error answer: JSON {"error": message, **extra}, plus the X-Error-Code / X-Error-Message headers."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.extra = headers or {}, extra or {}


@dataclass
class Request:
    method: str
    query: dict[str, list[str]]
    body: bytes
    headers: Any
    authed: bool  # a valid token was sent

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            raise HubError(400, "Request body is not valid JSON") from None

    def flag(self, name: str) -> bool:
        return self.query.get(name, [""])[0].lower() in ("1", "true")


Response = tuple[int, dict[str, str], bytes]


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode()


class FakeHub:
    """An in-memory Hub on 127.0.0.1 (free port), served from a background thread. Use as a context manager."""

    def __init__(self, token: str = "hf_test_token"):
        self.token = token
        self.url = ""
        self._lock = threading.RLock()
        self._repos: dict[str, dict[str, Any]] = {}
        self._lfs_objects: dict[str, bytes] = {}  # the LFS object store, by sha256
        self._secret = secrets.token_bytes(16)  # signs LFS upload URLs
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # (method, path regex, handler); the first full match wins.
        self._routes = [
            ("POST", r"/api/repos/create", self._create_repo),
            ("POST", r"/api/validate-yaml", self._validate_yaml),
            ("GET", rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?", self._tree),
            ("GET", rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?", self._model_info),
            ("POST", rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)", self._preupload),
            ("POST", rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", self._commit),
            ("POST", rf"/{_REPO}\.git/info/lfs/objects/batch", self._lfs_batch),
            ("PUT", r"/lfs-storage/(?P<oid>[0-9a-f]{64})", self._lfs_put),
            ("HEAD", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", self._resolve),
            ("GET", rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", self._resolve),
        ]

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        handler = type("FakeHubHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client_env(self, home: str | os.PathLike, token: str | None = None) -> dict[str, str]:
        """The environment of a process whose huggingface_hub talks to this server (HF_ENDPOINT is read when
        huggingface_hub is imported, so the client runs in a process started with it). The caller's Hub
        settings are dropped, offline switches included; `home` keeps its cache and tokens apart."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_")) and "OFFLINE" not in k}
        env.update(
            HF_ENDPOINT=self.url,
            HF_HUB_DISABLE_XET="1",
            HF_HOME=str(home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        if token:
            env["HF_TOKEN"] = token
        return env

    # ---- what the server holds, for assertions --------------------------------------------------------------------

    def files(self, repo_id: str) -> dict[str, bytes]:
        """The files at the head of `main`: path -> bytes."""
        with self._lock:
            repo = self._repos[repo_id]
            return {path: f.data for path, f in repo["trees"][repo["sha"]].items()}

    def repo(self, repo_id: str) -> dict[str, Any]:
        """{"private", "sha" (head of main), "lfs" (paths stored through LFS), "commits" (summaries, oldest first)}."""
        with self._lock:
            repo = self._repos[repo_id]
            head = repo["trees"][repo["sha"]]
            return {
                "private": repo["private"],
                "sha": repo["sha"],
                "lfs": sorted(path for path, f in head.items() if f.lfs),
                "commits": [summary for _, summary in repo["log"]],
            }

    # ---- request dispatch (called from the handler threads) -------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> Response:
        parts = urlsplit(raw_path)
        try:
            request = Request(method, parse_qs(parts.query), body, headers, authed=self._check_token(headers))
            for route_method, pattern, handler in self._routes:
                match = re.fullmatch(pattern, parts.path)
                if route_method == method and match:
                    args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                    with self._lock:
                        return handler(request, **args)
            raise HubError(404, f"FakeHub does not implement {method} {parts.path}")
        except (KeyError, TypeError, ValueError) as e:  # a payload without the fields the Hub expects
            return self._error(HubError(400, f"Malformed request: {type(e).__name__}: {e}"))
        except HubError as e:
            return self._error(e)

    @staticmethod
    def _error(e: HubError) -> Response:
        error_headers = {"X-Error-Message": e.message.encode("ascii", "replace").decode(), **e.headers}
        if e.code:
            error_headers["X-Error-Code"] = e.code
        return _json({"error": e.message, **e.extra}, e.status, error_headers)

    def _check_token(self, headers: Any) -> bool:
        """True for the right token, False for none; a wrong token is refused outright, as on the Hub."""
        authorization = headers.get("Authorization")
        if authorization is None:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.token):
            return True
        raise HubError(401, "Invalid credentials in Authorization header")

    @staticmethod
    def _require_token(request: Request) -> None:
        if not request.authed:
            raise HubError(401, "You must be authenticated to access this resource: send a Bearer token")

    def _readable_repo(self, request: Request, repo_id: str) -> dict[str, Any]:
        """The repo, if it exists and the caller may read it; otherwise the Hub's "Repository not found"."""
        repo = self._repos.get(repo_id)
        if repo is None or (repo["private"] and not request.authed):
            status = 404 if request.authed else 401
            raise HubError(status, "Repository not found", code="RepoNotFound")
        return repo

    def _writable_repo(self, request: Request, repo_id: str, revision: str) -> dict[str, Any]:
        self._require_token(request)
        repo = self._readable_repo(request, repo_id)
        if revision != "main":
            raise HubError(400, f"FakeHub only writes to the main branch, not {revision!r}")
        if request.flag("create_pr"):
            raise HubError(400, "FakeHub does not support pull requests")
        return repo

    @staticmethod
    def _tree_at(repo: dict[str, Any], revision: str | None) -> tuple[str, dict[str, StoredFile]]:
        """(commit sha, files) for `main` or a full commit sha."""
        sha = repo["sha"] if revision in (None, "main") else revision
        if sha not in repo["trees"]:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return sha, repo["trees"][sha]

    def _new_commit(self, repo: dict[str, Any], files: dict[str, StoredFile], summary: str) -> str:
        sha = hashlib.sha1(uuid.uuid4().bytes).hexdigest()
        repo["trees"][sha] = files
        repo["sha"] = sha
        repo["log"].append((sha, summary))
        repo["last_modified"] = _now()
        return sha

    # ---- routes ---------------------------------------------------------------------------------------------------

    # POST /api/repos/create  {"name", "organization", "type", "visibility" | "private"}
    def _create_repo(self, request: Request) -> Response:
        self._require_token(request)
        payload = request.json() or {}
        if payload.get("type", "model") != "model":
            raise HubError(400, "FakeHub only hosts model repos")
        name, organization = payload.get("name"), payload.get("organization")
        if not name:
            raise HubError(400, "Missing repo name")
        repo_id = f"{organization}/{name}" if organization else name
        url = f"{self.url}/{repo_id}"
        if repo_id in self._repos:
            # create_repo(exist_ok=True) takes the repo URL from this 409 body
            raise HubError(409, "You already created this model repo", extra={"url": url})
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        now = _now()
        repo = {"private": private, "sha": "", "trees": {}, "log": [], "created_at": now, "last_modified": now}
        self._new_commit(repo, {}, "initial commit")
        self._repos[repo_id] = repo
        return _json({"url": url, "name": repo_id, "id": uuid.uuid4().hex[:24]})

    # POST /api/validate-yaml  {"content", "repoType"}: the README.md metadata check; everything passes here
    def _validate_yaml(self, request: Request) -> Response:
        return _json({"errors": [], "warnings": []})

    # GET /api/models/{repo_id}  and  GET /api/models/{repo_id}/revision/{rev}  (?blobs=true adds sizes and LFS info)
    def _model_info(self, request: Request, repo: str, rev: str | None = None) -> Response:
        state = self._readable_repo(request, repo)
        sha, files = self._tree_at(state, rev)
        siblings = []
        for path, f in sorted(files.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if request.flag("blobs"):
                sibling.update(size=len(f.data), blobId=f.blob_id)
                if f.lfs:
                    pointer_size = len(lfs_pointer(f.sha256, len(f.data)))
                    sibling["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": pointer_size}
            siblings.append(sibling)
        return _json(
            {
                "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
                "id": repo,
                "modelId": repo,
                "author": repo.split("/")[0] if "/" in repo else None,
                "sha": sha,
                "lastModified": state["last_modified"],
                "createdAt": state["created_at"],
                "private": state["private"],
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    # GET /api/models/{repo_id}/tree/{rev}[/{path}]?recursive=true  (one page: no Link header)
    def _tree(self, request: Request, repo: str, rev: str, path: str = "") -> Response:
        _, files = self._tree_at(self._readable_repo(request, repo), rev)
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
        if prefix and prefix.rstrip("/") not in folders:
            raise HubError(404, f"{path} does not exist at {rev}", code="EntryNotFound")
        entries = []
        for folder in sorted(folders):
            if self._in_listing(folder, prefix, request.flag("recursive")):
                entries.append({"type": "directory", "oid": git_blob_sha(folder.encode()), "path": folder})
        for file_path, f in sorted(files.items()):
            if self._in_listing(file_path, prefix, request.flag("recursive")):
                entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": len(f.data), "path": file_path}
                if f.lfs:
                    pointer_size = len(lfs_pointer(f.sha256, len(f.data)))
                    entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": pointer_size}
                entries.append(entry)
        return _json(entries)

    @staticmethod
    def _in_listing(path: str, prefix: str, recursive: bool) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    # POST /api/models/{repo_id}/preupload/{rev}  {"files": [{"path", "size", "sample" (base64 of the first 512 B)}]}
    def _preupload(self, request: Request, repo: str, rev: str) -> Response:
        state = self._writable_repo(request, repo, rev)
        head = state["trees"][state["sha"]]
        answers = []
        for item in (request.json() or {}).get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample", ""))
            is_lfs = path.lower().endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE or b"\0" in sample
            existing = head.get(path)
            answers.append(
                {
                    "path": path,
                    "uploadMode": "lfs" if is_lfs else "regular",
                    "shouldIgnore": False,
                    "oid": existing.remote_oid if existing else None,
                }
            )
        return _json({"files": answers, "commitOid": state["sha"]})

    # POST /{repo_id}.git/info/lfs/objects/batch  {"operation": "upload", "objects": [{"oid", "size"}], ...}
    def _lfs_batch(self, request: Request, repo: str) -> Response:
        payload = request.json() or {}
        ref = (payload.get("ref") or {}).get("name", "main")
        self._writable_repo(request, repo, ref)
        if payload.get("operation") != "upload":
            raise HubError(400, "FakeHub's LFS batch endpoint only supports the upload operation")
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not (isinstance(oid, str) and _SHA256.fullmatch(oid) and isinstance(size, int)):
                objects.append({"oid": str(oid), "size": int(size or 0), "error": {"code": 422, "message": "bad oid"}})
            elif oid in self._lfs_objects:
                objects.append({"oid": oid, "size": size})  # no "actions": already stored, nothing to upload
            else:
                href = f"{self.url}/lfs-storage/{oid}?size={size}&sig={self._sign(oid, size)}"
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {"upload": {"href": href}}})
        body = json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode()
        return 200, {"Content-Type": "application/vnd.git-lfs+json"}, body

    def _sign(self, oid: str, size: int) -> str:
        return hmac.new(self._secret, f"{oid}:{size}".encode(), hashlib.sha256).hexdigest()

    # PUT /lfs-storage/{sha256}?size=..&sig=..  (the upload URL handed out by the batch endpoint; no token needed)
    def _lfs_put(self, request: Request, oid: str) -> Response:
        size = request.query.get("size", [""])[0]
        signature = request.query.get("sig", [""])[0]
        if not size.isdigit() or not hmac.compare_digest(signature, self._sign(oid, int(size))):
            raise HubError(403, "SignatureDoesNotMatch")
        if len(request.body) != int(size) or hashlib.sha256(request.body).hexdigest() != oid:
            raise HubError(400, "Uploaded content does not match the oid and size it was announced with")
        self._lfs_objects[oid] = request.body
        return 200, {"ETag": f'"{oid}"'}, b""

    # POST /api/models/{repo_id}/commit/{rev}  (application/x-ndjson, one {"key", "value"} per line)
    def _commit(self, request: Request, repo: str, rev: str) -> Response:
        state = self._writable_repo(request, repo, rev)
        try:
            lines = [json.loads(line) for line in request.body.splitlines() if line.strip()]
        except ValueError:
            raise HubError(400, "Commit body is not valid NDJSON") from None
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if header is None:
            raise HubError(400, "Commit is missing its header line")
        parent = header.get("parentCommit")
        if parent and parent != state["sha"]:
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        files = dict(state["trees"][state["sha"]])
        for line in lines:
            key, value = line.get("key"), line.get("value") or {}
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, "FakeHub only accepts base64 file content")
                files[value["path"]] = StoredFile(base64.b64decode(value["content"]), lfs=False)
            elif key == "lfsFile":
                data = self._lfs_objects.get(value.get("oid", ""))
                if data is None:
                    raise HubError(422, f"LFS object {value.get('oid')} was not uploaded ({value.get('path')})")
                files[value["path"]] = StoredFile(data, lfs=True)
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(404, "A file with this name doesn't exist", code="EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {p: f for p, f in files.items() if not p.startswith(folder)}
            elif key != "header":
                raise HubError(400, f"FakeHub does not support commit operation {key!r}")
        sha = self._new_commit(state, files, header.get("summary", ""))
        return _json(
            {
                "success": True,
                "commitOid": sha,
                "commitUrl": f"{self.url}/{repo}/commit/{sha}",
                "commitMessage": header.get("summary", ""),
                "pullRequestUrl": None,
                "hookOutput": "",
            }
        )

    # HEAD and GET /{repo_id}/resolve/{rev}/{path}  (GET honours "Range: bytes=a-b" for resumed downloads)
    def _resolve(self, request: Request, repo: str, rev: str, path: str) -> Response:
        sha, files = self._tree_at(self._readable_repo(request, repo), rev)
        f = files.get(path)
        if f is None:
            raise HubError(404, "Entry not found", code="EntryNotFound", headers={"X-Repo-Commit": sha})
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "X-Repo-Commit": sha,
            "ETag": f'"{f.blob_id}"',
        }
        if f.lfs:  # what the Hub puts on its redirect to the CDN: the LFS sha256 and the real size
            etag = f'"{f.sha256}"'
            headers.update({"ETag": etag, "X-Linked-Etag": etag, "X-Linked-Size": str(len(f.data))})
        byte_range = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", "") or "")
        if request.method == "GET" and byte_range:
            start = int(byte_range[1])
            end = min(int(byte_range[2]) if byte_range[2] else len(f.data) - 1, len(f.data) - 1)
            if start >= len(f.data):
                raise HubError(416, "Requested range not satisfiable")
            headers["Content-Range"] = f"bytes {start}-{end}/{len(f.data)}"
            return 206, headers, f.data[start : end + 1]
        return 200, headers, f.data


class _Handler(BaseHTTPRequestHandler):
    """HTTP plumbing only: read the body (Content-Length or chunked), let FakeHub answer, write the answer."""

    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        status, headers, body = self.hub.handle(self.command, self.path, self.headers, self._read_body())
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))  # for HEAD: the length a GET would send
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
            while self.rfile.readline().strip():  # optional trailers, up to the blank line
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass
