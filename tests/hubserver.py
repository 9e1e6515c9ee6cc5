"""A small HuggingFace-Hub-compatible HTTP server for tests.

It speaks the wire format the real ``huggingface_hub`` client (0.36) uses, so
tests run the real client against it via ``endpoint=server.url``:

    GET  /api/whoami-v2                             whoami (the token's user and role)
    GET  /api/models?author=...                     list_models (expand=sha/siblings; Link pagination)
    POST /api/repos/create                          create_repo
    POST /api/validate-yaml                         README.md metadata check before a commit
    GET  /api/models/{repo}[/revision/{rev}]        model_info / repo_info (siblings, ?blobs=1)
    GET  /api/models/{repo}/tree/{rev}[/{path}]     list_repo_tree (?recursive)
    POST /api/models/{repo}/paths-info/{rev}        get_paths_info
    POST /api/models/{repo}/preupload/{rev}         upload mode (regular / lfs) + remote oid per file
    POST /{repo}.git/info/lfs/objects/batch         LFS batch: upload + verify actions pointing back here
    PUT  /lfs/{repo}/objects/{oid}                  basic LFS transfer (checks the sha256)
    POST /lfs/{repo}/verify/{oid}                   LFS verify
    POST /api/models/{repo}/commit/{rev}            the NDJSON commit (one atomic commit per call)
    POST /api/models/{repo}/tag/{rev}               create_tag
    HEAD/GET /{repo}/resolve/{rev}/{path}           hf_hub_download / snapshot_download

Repos live in memory as real commits (a sha per commit, parent links, branches
and tags), so a revision or sha resolves to exactly what it named; LFS objects
are stored per repo, as on the Hub. Only the basic LFS transfer is offered
(never xet), so uploads and downloads are plain HTTP. ``seed_repo`` writes a
folder as a commit directly, for test set-up.

Rate limits, as the Hub enforces them per token but over a sliding window (stricter
than the Hub's fixed 5-minute windows, so "the minimum the budget allows" is
well defined): ``HubServer(limits={"api": (60, 10.0), "resolvers": (300, 10.0),
"commits": (5, 10.0)})`` answers a request beyond ``n`` accepted ones in the last
``seconds`` of its bucket with 429, ``Retry-After`` (seconds until a slot frees) and
the Hub's ``RateLimit`` header. Buckets: ``api`` is every ``/api/`` route,
``resolvers`` every ``/resolve/`` download, ``commits`` the commit route (also an
``api`` request). Refused requests do not count.

Fault injection: ``server.fail_next(r"/commit/", 429, times=1, retry_after=0.1)``
answers the next matching request(s) with that status before touching state;
``server.stall_next(r"/api/models/", 5.0)`` holds them before answering (a slow Hub);
``server.delay_next(r"/api/models/", 1.0)`` before their arrival is stamped (a slow network).
``server.log`` records every request as ``(method, path, status)``; ``server.events``
adds the route name, the buckets and the time, and ``server.counts()`` tallies
requests per route.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import yaml

# The Hub's default .gitattributes for a new model repo (LFS part); it decides upload modes.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
        "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
        "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*",
        "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*",
    )
)
# Above this size the Hub stores a file in LFS whatever its name.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024


def git_blob_oid(content: bytes) -> str:
    """The git object id of a blob, as the Hub reports for regular files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file stored in git in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class RepoFileEntry:
    """One file in one commit: content plus how git and LFS see it."""

    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.sha256, len(self.content))

    @property
    def blob_oid(self) -> str:
        return git_blob_oid(self.pointer if self.lfs else self.content)

    def info(self, path: str) -> dict[str, Any]:
        """The JSON the tree and paths-info APIs return for this file."""
        d: dict[str, Any] = {"type": "file", "oid": self.blob_oid, "size": len(self.content), "path": path}
        if self.lfs:
            d["lfs"] = {"oid": self.sha256, "size": len(self.content), "pointerSize": len(self.pointer)}
        return d


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot of a repo's files."""

    sha: str
    parent: str | None
    title: str
    files: dict[str, RepoFileEntry]
    date: str


@dataclass
class Repo:
    """A model repo: commits by sha, branches and tags pointing at them."""

    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)

    def resolve(self, rev: str) -> Commit | None:
        sha = self.refs.get(rev) or self.tags.get(rev) or rev
        return self.commits.get(sha)

    def history(self, rev: str = "main") -> list[Commit]:
        """Commits reachable from ``rev``, newest first."""
        out, commit = [], self.resolve(rev)
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out


@dataclass
class _Fault:
    pattern: re.Pattern[str]
    status: int | None  # None: answer normally, after ``stall_s``
    times: int
    retry_after: float | None
    method: str | None
    stall_s: float = 0.0
    late_s: float = 0.0  # held before the Hub stamps and counts the request: it arrives this late


@dataclass(frozen=True)
class Event:
    """One request as the server answered it.

    Attributes:
        method / path / status: the request line and the answer.
        route: a name for the endpoint (``model_info``, ``resolve``, ``commit``, ...).
        buckets: the rate-limit buckets it counts in.
        t: ``time.monotonic()`` when it arrived.
    """

    method: str
    path: str
    status: int
    route: str
    buckets: tuple[str, ...]
    t: float


class _HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, body: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body


class HubServer:
    """A threaded Hub look-alike on 127.0.0.1 at a random port; use as a context manager."""

    def __init__(
        self,
        token: str | None = None,
        *,
        limits: dict[str, tuple[int, float]] | None = None,
        token_role: str = "write",
        page_size: int = 1000,
    ) -> None:
        self.token = token
        self.token_role = token_role
        self.limits = dict(limits or {})
        self.page_size = page_size
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, int]] = []
        self.events: list[Event] = []
        self._accepted: dict[str, deque[float]] = {b: deque() for b in self.limits}
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hubserver", daemon=True)

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()

    def fail_next(
        self, path_regex: str, status: int, *, times: int = 1, retry_after: float | None = None, method: str | None = None
    ) -> None:
        """Answer the next ``times`` requests whose path matches with ``status`` (and Retry-After)."""
        with self._lock:
            self._faults.append(_Fault(re.compile(path_regex), status, times, retry_after, method))

    def stall_next(self, path_regex: str, seconds: float, *, times: int = 1) -> None:
        """Hold the next ``times`` matching requests for ``seconds`` before answering them normally."""
        with self._lock:
            self._faults.append(_Fault(re.compile(path_regex), None, times, None, None, seconds))

    def delay_next(self, path_regex: str, seconds: float, *, times: int = 1) -> None:
        """Let the next ``times`` matching requests arrive ``seconds`` late (a slow network): they are held before
        the server stamps their arrival and counts them against a limit."""
        with self._lock:
            self._faults.append(_Fault(re.compile(path_regex), None, times, None, None, late_s=seconds))

    def forget_requests(self) -> None:
        """Empty every rate-limit window at once, as if its requests had aged out."""
        with self._lock:
            for accepted in self._accepted.values():
                accepted.clear()

    def requests(self, method: str | None = None, path_regex: str = "") -> list[tuple[str, str, int]]:
        """Logged requests, filtered by method and a regex on the path."""
        with self._lock:
            return [r for r in self.log if (method is None or r[0] == method) and re.search(path_regex, r[1])]

    def counts(self, *, status: int | None = None, since: float = 0.0) -> Counter[str]:
        """Requests per route name (answered with ``status`` when given, arrived at or after ``since``)."""
        with self._lock:
            return Counter(e.route for e in self.events if (status is None or e.status == status) and e.t >= since)

    def commits(self, repo_id: str, rev: str = "main") -> list[Commit]:
        """The history of a branch, newest first."""
        with self._lock:
            return self.repos[repo_id].history(rev)

    def seed_repo(self, repo_id: str, folder: Path, *, tag: str | None = None, private: bool = False) -> str:
        """Commit every file under ``folder`` to ``repo_id`` (created if missing) on main; returns the sha."""
        with self._lock:
            if repo_id not in self.repos:
                self._create(repo_id, private)
            repo = self.repos[repo_id]
            parent = self._commit(repo, "main")
            patterns = _lfs_patterns(DEFAULT_GITATTRIBUTES)
            files = dict(parent.files)
            for p in sorted(folder.rglob("*")):
                if p.is_file():
                    rel = p.relative_to(folder).as_posix()
                    data = p.read_bytes()
                    files[rel] = RepoFileEntry(data, lfs=_matches(rel, patterns) or b"\0" in data[:512])
                    if files[rel].lfs:
                        repo.lfs[files[rel].sha256] = data
            commit = self._new_commit(repo, "main", parent, f"seed {folder.name}", files)
            if tag:
                repo.tags[tag] = commit.sha
        return commit.sha

    # -- request handling (called from handler threads) ------------------------------------

    def _admit(self, buckets: tuple[str, ...], now: float) -> tuple[str, float] | None:
        """None when the request fits every limited bucket (and is counted), else the full bucket and its wait."""
        with self._lock:
            for bucket in buckets:
                if bucket in self.limits:
                    n, seconds = self.limits[bucket]
                    accepted = self._accepted[bucket]
                    while accepted and accepted[0] <= now - seconds:
                        accepted.popleft()
                    if len(accepted) >= n:
                        return bucket, accepted[0] + seconds - now
            for bucket in buckets:
                if bucket in self.limits:
                    self._accepted[bucket].append(now)
        return None

    def _take_fault(self, method: str, path: str, *, late: bool = False) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and (fault.method in (None, method)) and fault.pattern.search(path) \
                        and (fault.late_s > 0) == late:
                    fault.times -= 1
                    return fault
        return None

    def _authorized(self, headers: Any) -> bool:
        if self.token is None:
            return True
        return headers.get("authorization", "") == f"Bearer {self.token}"

    def _require_write(self, headers: Any) -> None:
        if not self._authorized(headers):
            raise _HttpError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_id: str, headers: Any) -> Repo:
        repo = self.repos.get(repo_id)
        # Like the Hub: a private repo is indistinguishable from a missing one without access.
        if repo is None or (repo.private and not self._authorized(headers)):
            raise _HttpError(404 if self.token is None else 401, "Repository not found", "RepoNotFound")
        return repo

    def _commit(self, repo: Repo, rev: str) -> Commit:
        commit = repo.resolve(rev)
        if commit is None:
            raise _HttpError(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        return commit

    def _new_commit(self, repo: Repo, branch: str, parent: Commit | None, title: str, files: dict) -> Commit:
        date = _now()
        digest = hashlib.sha1(json.dumps([repo.repo_id, parent and parent.sha, title, date, len(repo.commits),
                                          sorted((p, f.blob_oid) for p, f in files.items())]).encode())
        commit = Commit(sha=digest.hexdigest(), parent=parent.sha if parent else None, title=title, files=files,
                        date=date)
        repo.commits[commit.sha] = commit
        repo.refs[branch] = commit.sha
        return commit

    def whoami(self, headers: Any) -> dict:
        if self.token is not None and not self._authorized(headers):
            raise _HttpError(401, "Invalid credentials in Authorization header")
        return {"type": "user", "name": "tester", "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": self.token_role}}}

    def list_models(self, params: dict, headers: Any) -> tuple[list[dict], str | None]:
        """One page of the repos of ``author`` (sorted by id), and the next page's query string."""
        author = params.get("author", [None])[0]
        start = int(params.get("cursor", ["0"])[0])
        expand = set(params.get("expand", []))
        with self._lock:
            ids = sorted(r for r, repo in self.repos.items()
                         if (author is None or r.split("/")[0] == author) and (not repo.private or self._authorized(headers)))
        page = ids[start : start + self.page_size]
        items = []
        for repo_id in page:
            info = self.repo_info(repo_id, "main", {}, headers)
            item = {"_id": info["_id"], "id": repo_id, "modelId": repo_id}
            item.update({k: info[k] for k in ("sha", "siblings", "private", "lastModified") if k in expand})
            items.append(item)
        more = start + self.page_size < len(ids)
        next_query = urlencode({**{k: v for k, v in params.items() if k != "cursor"}, "cursor": start + self.page_size},
                               doseq=True) if more else None
        return items, next_query

    def create_repo(self, body: dict, headers: Any) -> dict:
        self._require_write(headers)
        if body.get("type", "model") not in (None, "model"):
            raise _HttpError(400, "only model repos are supported by this test server")
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        url = f"{self.url}/{repo_id}"
        with self._lock:
            if repo_id in self.repos:
                raise _HttpError(409, "You already created this model repo", body={"error": "You already created "
                                 "this model repo", "url": url})
            self._create(repo_id, bool(body.get("private")))
        return {"url": url, "name": repo_id, "id": repo_id}

    def _create(self, repo_id: str, private: bool) -> None:
        """A new repo whose main holds the default .gitattributes, as the Hub makes it."""
        repo = Repo(repo_id=repo_id, private=private, created_at=_now())
        self._new_commit(repo, "main", None, "initial commit",
                         {".gitattributes": RepoFileEntry(DEFAULT_GITATTRIBUTES.encode(), lfs=False)})
        self.repos[repo_id] = repo

    def repo_info(self, repo_id: str, rev: str, params: dict, headers: Any) -> dict:
        with self._lock:
            repo = self._repo(repo_id, headers)
            commit = self._commit(repo, rev)
        blobs = params.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path, f in sorted(commit.files.items()):
            s: dict[str, Any] = {"rfilename": path}
            if blobs:
                s.update(size=len(f.content), blobId=f.blob_oid)
                if f.lfs:
                    s["lfs"] = {"size": len(f.content), "sha256": f.sha256, "pointerSize": len(f.pointer)}
            siblings.append(s)
        card = _front_matter(commit.files["README.md"].content.decode()) if "README.md" in commit.files else None
        card = card if isinstance(card, dict) else {}
        return {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit.sha,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": list(card.get("tags") or []),
            "pipeline_tag": card.get("pipeline_tag"),
            "library_name": card.get("library_name"),
            "cardData": card or None,
            "siblings": siblings,
        }

    def tree(self, repo_id: str, rev: str, prefix: str, recursive: bool, headers: Any) -> list[dict]:
        with self._lock:
            commit = self._commit(self._repo(repo_id, headers), rev)
        prefix = prefix.strip("/")
        base = prefix + "/" if prefix else ""
        if prefix and not any(p.startswith(base) for p in commit.files):
            raise _HttpError(404, f"{prefix} does not exist on {rev}", "EntryNotFound")
        entries: dict[str, dict] = {}
        for path, f in commit.files.items():
            if not path.startswith(base):
                continue
            parts = path[len(base):].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):
                folder = base + "/".join(parts[:i])
                entries[folder] = {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(),
                                   "size": 0, "path": folder}
            if recursive or len(parts) == 1:
                entries[path] = f.info(path)
        return [entries[k] for k in sorted(entries)]

    def paths_info(self, repo_id: str, rev: str, paths: list[str], headers: Any) -> list[dict]:
        with self._lock:
            commit = self._commit(self._repo(repo_id, headers), rev)
        out = []
        for path in paths:
            path = path.strip("/")
            if path in commit.files:
                out.append(commit.files[path].info(path))
            elif any(p.startswith(path + "/") for p in commit.files):
                out.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                            "path": path})
        return out

    def preupload(self, repo_id: str, rev: str, body: dict, headers: Any) -> dict:
        self._require_write(headers)
        with self._lock:
            commit = self._commit(self._repo(repo_id, headers), rev)
        attrs = commit.files.get(".gitattributes")
        patterns = _lfs_patterns(attrs.content.decode() if attrs else "")
        files = []
        for f in body["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = f["size"] >= LFS_SIZE_THRESHOLD or b"\0" in sample or _matches(f["path"], patterns)
            remote = commit.files.get(f["path"])
            oid = None
            if remote is not None:
                oid = remote.sha256 if remote.lfs else remote.blob_oid
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": oid})
        return {"files": files, "commitOid": commit.sha}

    def lfs_batch(self, repo_id: str, body: dict, headers: Any) -> dict:
        self._require_write(headers)
        with self._lock:
            repo = self._repo(repo_id, headers)
        if body.get("operation") != "upload":
            raise _HttpError(400, "only uploads are supported by this test server")
        objects = []
        for obj in body["objects"]:
            out: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            with self._lock:
                present = obj["oid"] in repo.lfs
            if not present:
                out["actions"] = {
                    "upload": {"href": f"{self.url}/lfs/{repo_id}/objects/{obj['oid']}",
                               "expires_at": "2099-01-01T00:00:00Z"},
                    "verify": {"href": f"{self.url}/lfs/{repo_id}/verify/{obj['oid']}", "header": {}},
                }
            objects.append(out)
        # Answer "basic" explicitly: the client must never switch to xet against this server.
        return {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def lfs_put(self, repo_id: str, oid: str, data: bytes) -> dict:
        if hashlib.sha256(data).hexdigest() != oid:
            raise _HttpError(400, "sha256 of the uploaded content does not match the oid")
        with self._lock:
            self.repos[repo_id].lfs[oid] = data
        return {}

    def lfs_verify(self, repo_id: str, oid: str, body: dict) -> dict:
        with self._lock:
            data = self.repos[repo_id].lfs.get(oid)
        if data is None or len(data) != body.get("size"):
            raise _HttpError(404, f"LFS object {oid} not found or wrong size")
        return {}

    def commit(self, repo_id: str, rev: str, ndjson: bytes, headers: Any) -> dict:
        self._require_write(headers)
        lines = [json.loads(line) for line in ndjson.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _HttpError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        with self._lock:
            repo = self._repo(repo_id, headers)
            parent = self._commit(repo, rev)
            if rev not in repo.refs:
                raise _HttpError(400, f"can only commit to a branch, not {rev}")
            if header.get("parentCommit") and header["parentCommit"] != parent.sha:
                raise _HttpError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(parent.files)
            for line in lines[1:]:
                key, value = line["key"], line["value"]
                path = value["path"]
                if key == "file":
                    files[path] = RepoFileEntry(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    data = repo.lfs.get(value["oid"])
                    if data is None:
                        raise _HttpError(422, f"LFS object {value['oid']} for {path} was never uploaded")
                    files[path] = RepoFileEntry(data, lfs=True)
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise _HttpError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    files = {p: f for p, f in files.items() if not p.startswith(path.rstrip("/") + "/")}
                else:
                    raise _HttpError(400, f"unknown commit operation {key!r}")
            if "README.md" in files and files["README.md"] is not parent.files.get("README.md"):
                errors = _validate_card(files["README.md"].content.decode(errors="replace"))
                if errors:
                    raise _HttpError(400, "Invalid metadata in README.md.\n" + "\n".join(errors))
            commit = self._new_commit(repo, rev, parent, header.get("summary") or "update", files)
        return {"success": True, "commitOid": commit.sha, "commitUrl": f"{self.url}/{repo_id}/commit/{commit.sha}",
                "pullRequestUrl": None}

    def create_tag(self, repo_id: str, rev: str, body: dict, headers: Any) -> dict:
        self._require_write(headers)
        with self._lock:
            repo = self._repo(repo_id, headers)
            commit = self._commit(repo, rev)
            if body["tag"] in repo.tags:
                raise _HttpError(409, f"Tag {body['tag']} already exists")
            repo.tags[body["tag"]] = commit.sha
        return {}

    def resolve(self, repo_id: str, rev: str, path: str, headers: Any) -> tuple[Commit, RepoFileEntry]:
        with self._lock:
            commit = self._commit(self._repo(repo_id, headers), rev)
        f = commit.files.get(path)
        if f is None:
            raise _HttpError(404, f"Entry not found: {path}", "EntryNotFound", body={"commit": commit.sha})
        return commit, f


def _make_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
            return

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_HEAD(self) -> None:
            self._dispatch("HEAD")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def _body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def _dispatch(self, method: str) -> None:
            split = urlsplit(self.path)
            path, params = split.path, parse_qs(split.query)
            body = self._body() if method in ("POST", "PUT") else b""
            if (late := hub._take_fault(method, path, late=True)) is not None:
                time.sleep(late.late_s)
            t = time.monotonic()
            route, buckets = _route_name(method, path)
            self._pending = (method, path, route, buckets, t)
            refused = hub._admit(buckets, t)
            fault = hub._take_fault(method, path) if refused is None else None
            try:
                if refused is not None:
                    bucket, wait = refused
                    n, seconds = hub.limits[bucket]
                    headers = {"Retry-After": f"{wait:.2f}", "RateLimit": f'"{bucket}";r=0;t={wait:.2f}',
                               "RateLimit-Policy": f'"fixed window";"{bucket}";q={n};w={seconds:g}'}
                    raise _HttpError(429, f"rate limit of {n} {bucket} requests per {seconds:g} s reached",
                                     body={"error": "Too Many Requests", "_headers": headers})
                if fault is not None and fault.status is None:
                    time.sleep(fault.stall_s)
                    fault = None
                if fault is not None:
                    extra = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
                    raise _HttpError(fault.status, f"injected {fault.status}", body={"error": "injected",
                                                                                   "_headers": extra})
                self._route(method, path, params, body)
            except _HttpError as exc:
                self._error(method, exc)
            except Exception as exc:  # noqa: BLE001 - a server bug must show as a 500, not a hang
                self._error(method, _HttpError(500, f"{type(exc).__name__}: {exc}"))

        def send_response(self, code: int, message: str | None = None) -> None:
            # Logged before the client can read the answer: a test that counts requests right after
            # its call returns must find this one already there.
            pending, self._pending = getattr(self, "_pending", None), None
            if pending is not None:
                method, path, route, buckets, t = pending
                with hub._lock:
                    hub.log.append((method, path, code))
                    hub.events.append(Event(method, path, code, route, buckets, t))
            super().send_response(code, message)

        def _route(self, method: str, path: str, params: dict, body: bytes) -> int:
            seg = [unquote(s) for s in path.strip("/").split("/")]
            h = self.headers
            if method == "GET" and path == "/api/whoami-v2":
                return self._json(hub.whoami(h))
            if method == "GET" and path == "/api/models":
                items, next_query = hub.list_models(params, h)
                link = {"Link": f'<{hub.url}/api/models?{next_query}>; rel="next"'} if next_query else {}
                return self._json(items, headers=link)
            if method == "POST" and path == "/api/repos/create":
                return self._json(hub.create_repo(json.loads(body), h))
            if method == "POST" and path == "/api/validate-yaml":
                errors = _validate_card(json.loads(body)["content"])
                if errors:
                    raise _HttpError(400, "invalid metadata", body={"errors": [{"message": e} for e in errors]})
                return self._json({"errors": [], "warnings": []})
            if seg[:2] == ["api", "models"] and len(seg) >= 4:
                repo_id, rest = f"{seg[2]}/{seg[3]}", seg[4:]
                if method == "GET" and not rest:
                    return self._json(hub.repo_info(repo_id, "main", params, h))
                if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                    return self._json(hub.repo_info(repo_id, rest[1], params, h))
                if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                    recursive = params.get("recursive", ["false"])[0].lower() in ("1", "true")
                    return self._json(hub.tree(repo_id, rest[1], "/".join(rest[2:]), recursive, h))
                if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
                    form = parse_qs(body.decode())
                    return self._json(hub.paths_info(repo_id, rest[1], form.get("paths", []), h))
                if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                    return self._json(hub.preupload(repo_id, rest[1], json.loads(body), h))
                if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                    return self._json(hub.commit(repo_id, rest[1], body, h))
                if method == "POST" and len(rest) == 2 and rest[0] == "tag":
                    return self._json(hub.create_tag(repo_id, rest[1], json.loads(body), h))
            if method == "POST" and len(seg) == 6 and seg[1].endswith(".git") and seg[2:] == [
                "info", "lfs", "objects", "batch"
            ]:
                repo_id = f"{seg[0]}/{seg[1][: -len('.git')]}"
                return self._json(hub.lfs_batch(repo_id, json.loads(body), h), "application/vnd.git-lfs+json")
            if seg[0] == "lfs" and len(seg) == 5 and f"{seg[1]}/{seg[2]}" in hub.repos:
                repo_id, action, oid = f"{seg[1]}/{seg[2]}", seg[3], seg[4]
                if method == "PUT" and action == "objects":
                    return self._json(hub.lfs_put(repo_id, oid, body))
                if method == "POST" and action == "verify":
                    return self._json(hub.lfs_verify(repo_id, oid, json.loads(body)))
            if method in ("GET", "HEAD") and len(seg) >= 5 and seg[2] == "resolve":
                return self._file(method, f"{seg[0]}/{seg[1]}", seg[3], "/".join(seg[4:]))
            raise _HttpError(404, f"no route for {method} {path}")

        def _file(self, method: str, repo_id: str, rev: str, path: str) -> int:
            commit, f = hub.resolve(repo_id, rev, path, self.headers)
            data, status = f.content, 200
            rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("range", ""))
            if rng and method == "GET":
                start = int(rng.group(1))
                end = int(rng.group(2)) + 1 if rng.group(2) else len(data)
                data, status = data[start:end], 206
            etag = f.sha256 if f.lfs else f.blob_oid
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", commit.sha)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("Accept-Ranges", "bytes")
            if f.lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(f.content)))
            self.end_headers()
            if method == "GET":
                self.wfile.write(data)
            return status

        def _json(self, obj: Any, content_type: str = "application/json", status: int = 200,
                  headers: dict[str, str] | None = None) -> int:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            return status

        def _error(self, method: str, exc: _HttpError) -> None:
            body = dict(exc.body or {"error": exc.message})
            extra = body.pop("_headers", {})
            data = json.dumps(body).encode()
            self.send_response(exc.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Error-Message", exc.message.splitlines()[0][:200])
            if exc.code:
                self.send_header("X-Error-Code", exc.code)
            if "commit" in body:
                self.send_header("X-Repo-Commit", body["commit"])
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

    return Handler


def _route_name(method: str, path: str) -> tuple[str, tuple[str, ...]]:
    """A name for the endpoint a request hits, and the rate-limit buckets it counts in."""
    seg = path.strip("/").split("/")
    if "resolve" in seg[2:3]:
        return ("resolve_head" if method == "HEAD" else "resolve"), ("resolvers",)
    if seg[0] != "api":
        return ("lfs_batch" if path.endswith("/info/lfs/objects/batch") else "lfs"), ()
    if path == "/api/models" and method == "GET":
        return "list_models", ("api",)
    if seg[:2] == ["api", "models"] and len(seg) >= 4:
        rest = seg[4:]
        name = "model_info" if not rest or rest[0] == "revision" else rest[0].replace("-", "_")
        return name, ("api", "commits") if name == "commit" else ("api",)
    return "_".join(seg[1:3]).replace("-", "_"), ("api",)


def _front_matter(text: str) -> Any:
    """The parsed YAML block at the top of a model card (None when there is none)."""
    m = re.match(r"^\s*---\r?\n(.*?)\r?\n---\s*(\r?\n|$)", text, re.DOTALL)
    return yaml.safe_load(m.group(1)) if m else None


def _validate_card(text: str) -> list[str]:
    """What the Hub would reject in a README's metadata (a subset of its checks)."""
    try:
        meta = _front_matter(text)
    except yaml.YAMLError as exc:
        return [f"Invalid YAML: {exc}"]
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return ["metadata must be a YAML mapping"]
    errors = []
    tags = meta.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        errors.append('"tags" must be an array of strings')
    for key in ("license", "library_name", "pipeline_tag"):
        if key in meta and not isinstance(meta[key], str):
            errors.append(f'"{key}" must be a string')
    base = meta.get("base_model")
    if base is not None and not (isinstance(base, str) or (isinstance(base, list) and all(isinstance(b, str) for b in base))):
        errors.append('"base_model" must be a string or an array of strings')
    return errors


def _lfs_patterns(gitattributes: str) -> list[str]:
    return [line.split()[0] for line in gitattributes.splitlines() if "filter=lfs" in line]


def _matches(path: str, patterns: list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in patterns)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")

