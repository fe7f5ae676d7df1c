"""A loopback Hugging Face Hub for tests: the endpoints huggingface_hub 2.x calls to publish, and those
`datasets.load_dataset(repo, config, revision=...)` reads a dataset through.

Routes, with the bodies huggingface_hub sends (read from hf_api.py and _commit_api.py):

    POST /api/repos/create                           {"name", "organization", "visibility", "type"}
    POST /api/<type>s/<repo_id>/branch/<branch>      {"startingPoint"?}            (create_branch)
    POST /api/validate-yaml                          {"content", "repoType"}       (a commit adding README.md)
    POST /api/<type>s/<repo_id>/preupload/<rev>      {"files": [{"path", "sample", "size"}]}
    POST /api/<type>s/<repo_id>/commit/<rev>         ndjson: {"key": "header"}, then "file" (base64
                                                     content inline), "deletedFile", "deletedFolder"
    GET  /api/<type>s/<repo_id>[/revision/<rev>]     repo_info: create_repo(exist_ok) asks it after a
                                                     401/402/403, create_commit after an empty commit
    POST /api/<type>s/<repo_id>/tag/<rev>            {"tag", "message"?}           (create_tag)
    GET  /api/<type>s/<repo_id>/refs                 branches and tags             (list_repo_refs)
    GET  /api/<type>s/<repo_id>/tree/<rev>[/<path>]  files and folders below path  (list_repo_tree)
    POST /api/<type>s/<repo_id>/paths-info/<rev>     form paths=...                (get_paths_info)
    HEAD|GET /<type>s/<repo_id>/resolve/<rev>/<path> a file's bytes, X-Repo-Commit and ETag (hf_hub_download)

A revision is a branch, a tag or a commit id.

Preupload answers every file 'regular', so huggingface_hub sends it inline in the commit and no
LFS or Xet transfer happens; an 'lfsFile' line is refused with 400. A new repo gets an initial
commit holding `.gitattributes` on `main`, as on the Hub; committing to a missing branch is a 404
RevisionNotFound. Errors carry the Hub's X-Error-Code / X-Error-Message headers.

    server = HubServer(token="hf_test", fail_at=1, fail_route="commit")  # the first commit gets a 500
    with server as endpoint:                                            # "http://127.0.0.1:<port>"
        HfApi(endpoint=endpoint, token="hf_test").create_repo(...)
    server.repo("owner/name").files("main")                             # {path: bytes}
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from tests.loopback import ThreadedServer

REPO_ROUTE = re.compile(r"^/api/(model|dataset|space)s/(.+?)/(branch|preupload|commit|tag|paths-info)/([^/]+)$")
REFS_ROUTE = re.compile(r"^/api/(model|dataset|space)s/([^/]+/[^/]+)/refs$")
TREE_ROUTE = re.compile(r"^/api/(model|dataset|space)s/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
RESOLVE_ROUTE = re.compile(r"^/(?:(dataset|space)s/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
INFO_ROUTE = re.compile(r"^/api/(model|dataset|space)s/([^/]+/[^/]+|[^/]+)(?:/revision/([^/]+))?$")
GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n*.png filter=lfs diff=lfs merge=lfs -text\n"


@dataclass
class HubRequest:
    """One request as received."""

    method: str
    path: str
    """URL path, still quoted."""
    route: str
    """'create_repo', 'branch', 'validate_yaml', 'preupload', 'commit', 'repo_info', 'tag', 'refs', 'tree',
    'paths-info', 'resolve', or '' (no route)."""
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    status: int = 0
    """What the server answered."""


@dataclass
class Commit:
    oid: str
    summary: str
    description: str
    added: tuple[str, ...]
    """Paths this commit wrote."""
    tree: dict[str, bytes]
    """Every file of the revision after this commit."""


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    branches: dict[str, list[Commit]] = field(default_factory=dict)
    """Branch -> its commits, oldest first."""
    tags: dict[str, Commit] = field(default_factory=dict)

    def commit(self, revision: str) -> Commit | None:
        """The commit a branch, tag or commit id names; None for none."""
        if revision in self.branches:
            return self.branches[revision][-1]
        if revision in self.tags:
            return self.tags[revision]
        return next((c for cs in self.branches.values() for c in cs if c.oid == revision), None)

    def files(self, revision: str = "main") -> dict[str, bytes]:
        return self.commit(revision).tree

    def commits(self, revision: str = "main") -> list[Commit]:
        return self.branches[revision]


class HubServer(ThreadedServer):
    """A threaded HTTP server on 127.0.0.1 keeping repos in memory; see the module docstring."""

    def __init__(self, token: str = "", *, fail_at: int = 0, fail_route: str = "", fail_status: int = 500):
        self.token = token
        """When set, any other Authorization than 'Bearer <token>' gets a 401."""
        self.fail_at = fail_at
        """Answer the Nth request (1-based; counting only `fail_route` requests when set) with fail_status."""
        self.fail_route = fail_route
        self.fail_status = fail_status
        self.requests: list[HubRequest] = []
        self.repos: dict[str, Repo] = {}
        """'<type>s/<repo_id>' -> repo."""
        self.unhandled: list[str] = []
        """'METHOD path' of requests no route matched: an endpoint the client calls that this server lacks."""
        self._lock = threading.Lock()

    def repo(self, repo_id: str, repo_type: str = "dataset") -> Repo:
        return self.repos[f"{repo_type}s/{repo_id}"]

    def routes(self) -> list[str]:
        """The route of every request so far, in order."""
        return [r.route for r in self.requests]

    def handle(self, request: HubRequest) -> tuple[int, dict, dict[str, str]]:
        """Record `request` and answer (status, JSON body, extra headers)."""
        with self._lock:
            self.requests.append(request)
            counts = not self.fail_route or request.route == self.fail_route
            counted = sum(1 for r in self.requests if not self.fail_route or r.route == self.fail_route)
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                answer = _error(401, "Invalid credentials in Authorization header")
            elif counts and counted == self.fail_at:
                answer = _error(self.fail_status, f"loopback: scripted failure of request {len(self.requests)}")
            else:
                answer = self._route(request)
            request.status = answer[0]
            return answer

    def _route(self, request: HubRequest) -> tuple[int, dict, dict[str, str]]:
        path = urlsplit(request.path).path
        if request.route == "create_repo":
            return self._create_repo(json.loads(request.body))
        if request.route == "validate_yaml":
            return _validate_yaml(json.loads(request.body))
        if request.route == "repo_info":
            return self._repo_info(INFO_ROUTE.match(path))
        if request.route in ("refs", "tree", "resolve"):
            return self._read(request.route, path)
        match = REPO_ROUTE.match(path)
        if match is None:
            self.unhandled.append(f"{request.method} {request.path}")
            return _error(404, f"loopback Hub has no route {request.method} {path}")
        kind, action = match.group(1), match.group(3)
        repo_id, revision = unquote(match.group(2)), unquote(match.group(4))
        repo = self.repos.get(f"{kind}s/{repo_id}")
        if repo is None:
            return _error(404, "Repository not found", code="RepoNotFound")
        if action == "branch":
            return self._create_branch(repo, revision, json.loads(request.body or b"{}"))
        if action == "tag":
            return self._create_tag(repo, revision, json.loads(request.body))
        if action == "paths-info":
            commit = repo.commit(revision)
            if commit is None:
                return _error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
            paths = parse_qs(request.body.decode()).get("paths", [])
            return 200, [e for p in paths for e in _entries(commit, p.strip("/"), False, itself=True)], {}
        if revision not in repo.branches:
            return _error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        if action == "preupload":
            files = json.loads(request.body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                   for f in files], "commitOid": repo.branches[revision][-1].oid}, {}
        return self._commit(repo, revision, request.body)

    def _create_repo(self, body: dict) -> tuple[int, dict, dict[str, str]]:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        kind = body.get("type") or "model"
        key = f"{kind}s/{repo_id}"
        url = f"{self.url}/{kind}s/{repo_id}" if kind != "model" else f"{self.url}/{repo_id}"
        if key in self.repos:
            return _error(409, "You already created this repo", extra={"url": url})
        private = body.get("visibility", "private" if body.get("private") else "public") == "private"
        repo = Repo(kind, repo_id, private)
        repo.branches["main"] = [_make_commit(None, "initial commit", "", {".gitattributes": GITATTRIBUTES})]
        self.repos[key] = repo
        return 200, {"url": url, "name": repo_id, "id": hashlib.sha1(key.encode()).hexdigest()[:24]}, {}

    def _repo_info(self, match: re.Match) -> tuple[int, dict, dict[str, str]]:
        kind, repo_id, revision = match.group(1), unquote(match.group(2)), unquote(match.group(3) or "main")
        repo = self.repos.get(f"{kind}s/{repo_id}")
        if repo is None:
            return _error(404, "Repository not found", code="RepoNotFound")
        head = repo.commit(revision)
        if head is None:
            return _error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return 200, {"id": repo_id, "private": repo.private, "sha": head.oid,
                     "siblings": [{"rfilename": path} for path in sorted(head.tree)]}, {}

    def _create_tag(self, repo: Repo, revision: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        commit = repo.commit(revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        if body["tag"] in repo.tags:
            return _error(409, f"Reference already exists: refs/tags/{body['tag']}")
        repo.tags[body["tag"]] = commit
        return 200, {}, {}

    def _read(self, route: str, path: str) -> tuple[int, object, dict[str, str]]:
        """refs, tree and resolve: what reading a repo asks."""
        match = {"refs": REFS_ROUTE, "tree": TREE_ROUTE, "resolve": RESOLVE_ROUTE}[route].match(path)
        kind = match.group(1) or "model"
        repo = self.repos.get(f"{kind}s/{unquote(match.group(2))}")
        if repo is None:
            return _error(404, "Repository not found", code="RepoNotFound")
        if route == "refs":
            return 200, {"branches": [_ref("heads", n, cs[-1]) for n, cs in repo.branches.items()], "converts": [],
                         "tags": [_ref("tags", n, c) for n, c in repo.tags.items()]}, {}
        revision = unquote(match.group(3))
        commit = repo.commit(revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        if route == "tree":
            return 200, _entries(commit, unquote(match.group(4) or "").strip("/"), "recursive=true" in path), {}
        file = unquote(match.group(4))
        if file not in commit.tree:
            return _error(404, f"Entry not found: {file}", code="EntryNotFound")
        content = commit.tree[file]
        return 200, content, {"X-Repo-Commit": commit.oid, "ETag": f'"{hashlib.sha1(content).hexdigest()}"'}

    def _create_branch(self, repo: Repo, branch: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        if branch in repo.branches:
            return _error(409, f"Reference already exists: refs/heads/{branch}")
        start = body.get("startingPoint") or "main"
        source = repo.branches.get(start) or [c for cs in repo.branches.values() for c in cs if c.oid == start]
        if not source:
            return _error(404, f"Invalid rev id: {start}", code="RevisionNotFound")
        repo.branches[branch] = [source[-1]]
        return 200, {}, {}

    def _commit(self, repo: Repo, revision: str, body: bytes) -> tuple[int, dict, dict[str, str]]:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return _error(400, "commit payload must start with a header line")
        head = repo.branches[revision][-1]
        tree, added = dict(head.tree), []
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                tree[value["path"]] = base64.b64decode(value["content"])
                added.append(value["path"])
            elif line["key"] == "deletedFile":
                tree.pop(value["path"], None)
            elif line["key"] == "deletedFolder":
                tree = {p: c for p, c in tree.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            else:
                return _error(400, f"loopback Hub takes files inline only, got a {line['key']!r} line")
        header = lines[0]["value"]
        commit = _make_commit(head.oid, header["summary"], header.get("description", ""), tree, tuple(added))
        repo.branches[revision].append(commit)
        prefix = f"{self.url}/{repo.repo_type}s" if repo.repo_type != "model" else self.url
        return 200, {"success": True, "commitOid": commit.oid, "hookOutput": "",
                     "commitUrl": f"{prefix}/{repo.repo_id}/commit/{commit.oid}"}, {}


def _entries(commit: Commit, folder: str, recursive: bool, itself: bool = False) -> list[dict]:
    """The tree entries under `folder` ('' the root), as the Hub lists them; `itself`: the entry of that path."""
    if itself:
        if folder in commit.tree:
            return [_file_entry(folder, commit.tree[folder])]
        below = [p for p in commit.tree if p.startswith(folder + "/")]
        return [_folder_entry(folder)] if below else []
    prefix = folder + "/" if folder else ""
    files, folders = [], set()
    for path in sorted(p for p in commit.tree if p.startswith(prefix)):
        parts = path[len(prefix):].split("/")
        if len(parts) == 1 or recursive:
            files.append(_file_entry(path, commit.tree[path]))
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
            folders.add(prefix + "/".join(parts[:depth]))
    return [_folder_entry(f) for f in sorted(folders)] + files


def _file_entry(path: str, content: bytes) -> dict:
    return {"type": "file", "oid": hashlib.sha1(content).hexdigest(), "size": len(content), "path": path}


def _folder_entry(path: str) -> dict:
    return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "path": path}


def _ref(kind: str, name: str, commit: Commit) -> dict:
    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": commit.oid}


def _make_commit(parent: str | None, summary: str, description: str, tree: dict[str, bytes],
                 added: tuple[str, ...] | None = None) -> Commit:
    digest = hashlib.sha1(f"{parent}\n{summary}\n{description}".encode())
    for path in sorted(tree):
        digest.update(path.encode() + hashlib.sha1(tree[path]).digest())
    return Commit(digest.hexdigest(), summary, description, tuple(tree) if added is None else added, tree)


def _validate_yaml(body: dict) -> tuple[int, dict, dict[str, str]]:
    """The card's YAML header must parse to a mapping, as the Hub's validator requires."""
    match = re.match(r"^---\n(.*?)\n---", body.get("content", ""), re.S)
    try:
        header = yaml.safe_load(match.group(1)) if match else {}
    except yaml.YAMLError as error:
        return 400, {"errors": [{"message": f"YAML header does not parse: {error}"}]}, {}
    if not isinstance(header, dict):
        return 400, {"errors": [{"message": "YAML header is not a mapping"}]}, {}
    return 200, {"errors": [], "warnings": []}, {}


def _error(status: int, message: str, *, code: str = "", extra: dict | None = None) -> tuple[int, dict, dict[str, str]]:
    headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
    return status, {"error": message, **(extra or {})}, headers


ROUTES = {"/api/repos/create": "create_repo", "/api/validate-yaml": "validate_yaml"}


class _Handler(BaseHTTPRequestHandler):
    owner: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx's pool expects

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        match = REPO_ROUTE.match(path)
        route = ROUTES.get(path) or (match.group(3) if match else "")
        request = HubRequest("POST", self.path, route, {k.lower(): v for k, v in self.headers.items()}, self._body())
        self._send(*self.owner.handle(request))

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        route = next((name for name, pattern in (("repo_info", INFO_ROUTE), ("refs", REFS_ROUTE), ("tree", TREE_ROUTE),
                                                 ("resolve", RESOLVE_ROUTE)) if pattern.match(path)), "")
        request = HubRequest(self.command, self.path, route, {k.lower(): v for k, v in self.headers.items()}, b"")
        self._send(*self.owner.handle(request))

    do_HEAD = do_GET

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _send(self, status: int, payload: object, headers: dict[str, str]) -> None:
        raw = isinstance(payload, bytes)  # a file's content, as resolve serves it
        data = payload if raw else json.dumps(payload).encode()
        self.send_response(status)
        kind = "application/octet-stream" if raw else "application/json"
        for name, value in {"content-type": kind, "content-length": str(len(data)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


HubServer.handler = _Handler
