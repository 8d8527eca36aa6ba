"""A tiny stand-in for the Hugging Face Hub, speaking just enough of its HTTP protocol for the real
``huggingface_hub`` client (2.x) to create repos, commit folders, resolve revisions, list trees and
download files.

Why a fake and not mocks: the issue asks that publish and load go through ``huggingface_hub``
unchanged, so the test must exercise the client's real requests, headers and cache layout. The
endpoints below are the ones that client calls (read from its ``hf_api.py``, ``_commit_api.py``,
``_upload_pipeline.py``, ``_snapshot_download.py`` and ``file_download.py``):

=====================================================  ==========================================
``POST /api/repos/create``                             ``HfApi.create_repo`` (409 when it exists)
``POST /api/validate-yaml``                            README front-matter check before upload
``POST /api/models/{repo}/preupload/{rev}``            upload modes; always "regular" so content
                                                       arrives base64 in the commit (no LFS/Xet)
``POST /api/models/{repo}/commit/{rev}``               NDJSON commit (file / deletedFile / ...)
``POST /api/models/{repo}/branch/{branch}``            ``HfApi.create_branch``
``POST /api/models/{repo}/discussions``                pull requests (``create_pr=True``)
``GET  /api/models/{repo}/discussions/{num}``          pull-request details
``GET  /api/models/{repo}[/revision/{rev}]``           ``model_info`` / revision -> commit sha
``GET  /api/models/{repo}/tree/{rev}``                 ``list_repo_tree`` (one page)
``HEAD|GET /{repo}/resolve/{rev}/{path}``              file metadata and content
=====================================================  ==========================================

Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) as the Hub does, so
the client raises its typed exceptions. Private repos and every write need ``Authorization:
Bearer <token>``. The server binds to 127.0.0.1 only, refuses bodies over ``MAX_BODY`` bytes, keeps
file bytes under a temporary folder, and is stopped by the fixture that started it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

MAX_BODY = 256 * 1024 * 1024
SOCKET_TIMEOUT_S = 30


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as a regular file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    sha: str
    files: dict[str, str]  # path -> blob sha1 (content under FakeHub.blob_dir)
    message: str
    created: float


@dataclass
class Repo:
    repo_id: str
    private: bool
    refs: dict[str, str] = field(default_factory=dict)  # branch / refs/pr/N -> commit sha
    commits: dict[str, Commit] = field(default_factory=dict)
    prs: dict[int, dict[str, Any]] = field(default_factory=dict)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class FakeHub:
    """State of the fake Hub plus its HTTP server; use as a context manager."""

    def __init__(self, root: Path, token: str = "hf_test_token") -> None:
        self.root = Path(root)
        self.blob_dir = self.root / "blobs"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []  # (method, path) log, for assertions
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ storage

    def _store(self, data: bytes) -> str:
        sha = git_blob_sha1(data)
        path = self.blob_dir / sha
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return sha

    def read_blob(self, sha: str) -> bytes:
        return (self.blob_dir / sha).read_bytes()

    def _commit(self, repo: Repo, parent: str | None, changes: list[tuple[str, dict[str, Any]]], message: str) -> Commit:
        files = dict(repo.commits[parent].files) if parent else {}
        for kind, value in changes:
            path = value["path"]
            if kind == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"unsupported encoding for {path}")
                files[path] = self._store(base64.b64decode(value["content"]))
            elif kind == "deletedFile":
                if path not in files:
                    raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                del files[path]
            elif kind == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                files = {p: s for p, s in files.items() if not p.startswith(prefix)}
            else:
                raise HubError(400, f"this fake Hub accepts only regular files, not {kind!r}")
        sha = hashlib.sha1(uuid.uuid4().bytes).hexdigest()
        commit = Commit(sha, files, message, time.time())
        repo.commits[sha] = commit
        return commit

    def get_repo(self, repo_id: str, authorized: bool) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorized):
            raise HubError(404, f"Repository Not Found for {repo_id}", "RepoNotFound")
        return repo

    @staticmethod
    def resolve(repo: Repo, revision: str) -> Commit:
        if revision in repo.refs:
            return repo.commits[repo.refs[revision]]
        if revision in repo.commits:
            return repo.commits[revision]
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")


_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>.+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>.+)$"), "commit"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/branch/(?P<rev>.+)$"), "create_branch"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/discussions$"), "create_discussion"),
    ("GET", re.compile(rf"^/api/models/{_REPO}/discussions/(?P<num>\d+)$"), "discussion"),
    ("GET", re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$"), "tree"),
    ("GET", re.compile(rf"^/api/models/{_REPO}/revision/(?P<rev>[^/]+)$"), "model_info"),
    ("GET", re.compile(rf"^/api/models/{_REPO}$"), "model_info"),
    ("GET", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("HEAD", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    timeout = SOCKET_TIMEOUT_S
    server_version = "FakeHub/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        self.hub.requests.append((method, split.path))
        try:
            for verb, pattern, name in _ROUTES:
                if verb == method and (match := pattern.match(split.path)):
                    params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                    with self.hub.lock:
                        getattr(self, "do_" + name)(**params)
                    return
            raise HubError(404, f"no route for {method} {split.path}")
        except HubError as exc:
            self._json({"error": exc.message}, status=exc.status, headers={"X-Error-Code": exc.code} if exc.code else {})
        except (KeyError, ValueError, TypeError) as exc:
            self._json({"error": f"bad request: {exc}"}, status=400)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _require_write(self) -> None:
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise HubError(413, "request body too large")
        return self.rfile.read(length) if length else b""

    def _json(self, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo_url(self, repo_id: str) -> str:
        return f"{self.hub.endpoint}/{repo_id}"

    # ------------------------------------------------------------------ endpoints

    def do_create_repo(self) -> None:
        self._require_write()
        payload = json.loads(self._body() or b"{}")
        if payload.get("type", "model") != "model":
            raise HubError(400, "this fake Hub only hosts model repos")
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else f"user/{payload['name']}"
        url = self._repo_url(repo_id)
        if repo_id in self.hub.repos:
            self._json({"error": "You already created this model repo", "url": url}, status=409)
            return
        repo = Repo(repo_id, private=payload.get("visibility") == "private" or bool(payload.get("private")))
        self.hub.repos[repo_id] = repo
        first = self.hub._commit(repo, None, [("file", {"path": ".gitattributes", "encoding": "base64",
                                                        "content": base64.b64encode(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n").decode()})],
                                 "initial commit")
        repo.refs["main"] = first.sha
        self._json({"url": url, "name": repo_id, "id": uuid.uuid4().hex})

    def do_validate_yaml(self) -> None:
        payload = json.loads(self._body() or b"{}")
        content = payload.get("content", "")
        if content.startswith("---") and content.find("\n---", 3) < 0:
            self._json({"errors": [{"message": "unterminated front matter"}], "warnings": []}, status=400)
            return
        self._json({"errors": [], "warnings": []})

    def do_preupload(self, repo: str, rev: str) -> None:
        self._require_write()
        repository = self.hub.get_repo(repo, authorized=True)
        payload = json.loads(self._body())
        existing = self.hub.resolve(repository, rev).files if rev in repository.refs or rev in repository.commits else {}
        files = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": existing.get(f["path"])}
            for f in payload["files"]
        ]
        self._json({"files": files, "commitOid": repository.refs.get("main")})

    def do_commit(self, repo: str, rev: str) -> None:
        self._require_write()
        repository = self.hub.get_repo(repo, authorized=True)
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        changes = [(item["key"], item["value"]) for item in lines if item["key"] != "header"]
        create_pr = self.query.get("create_pr") == "1"
        base = self.hub.resolve(repository, rev)
        if header.get("parentCommit") and header["parentCommit"] != base.sha:
            raise HubError(412, "parent commit is not the head of the revision")
        commit = self.hub._commit(repository, base.sha, changes, header.get("summary", ""))
        pr_url = None
        if create_pr:
            num = self._open_pr(repository, header.get("summary", ""), base=rev)
            repository.refs[f"refs/pr/{num}"] = commit.sha
            pr_url = f"{self._repo_url(repo)}/discussions/{num}"
        else:
            if rev not in repository.refs:
                raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            repository.refs[rev] = commit.sha
        self._json({"commitUrl": f"{self._repo_url(repo)}/commit/{commit.sha}", "commitOid": commit.sha,
                    "pullRequestUrl": pr_url, "success": True})

    def do_create_branch(self, repo: str, rev: str) -> None:
        self._require_write()
        repository = self.hub.get_repo(repo, authorized=True)
        payload = json.loads(self._body() or b"{}")
        if rev in repository.refs:
            raise HubError(409, f"Reference {rev} already exists")
        start = self.hub.resolve(repository, payload.get("startingPoint") or "main")
        repository.refs[rev] = start.sha
        self._json({})

    def _open_pr(self, repository: Repo, title: str, base: str = "main") -> int:
        num = len(repository.prs) + 1
        repository.prs[num] = {"title": title, "base": base, "created": time.time()}
        return num

    def do_create_discussion(self, repo: str) -> None:
        self._require_write()
        repository = self.hub.get_repo(repo, authorized=True)
        payload = json.loads(self._body() or b"{}")
        if not payload.get("pullRequest"):
            raise HubError(400, "this fake Hub supports pull requests only")
        num = self._open_pr(repository, payload.get("title", ""))
        repository.refs[f"refs/pr/{num}"] = repository.refs["main"]
        self._json({"num": num, "url": f"{self._repo_url(repo)}/discussions/{num}"})

    def do_discussion(self, repo: str, num: str) -> None:
        repository = self.hub.get_repo(repo, authorized=self._authorized())
        pr = repository.prs.get(int(num))
        if pr is None:
            raise HubError(404, f"Discussion {num} not found")
        created = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(pr["created"]))
        self._json({
            "num": int(num), "title": pr["title"], "status": "draft", "isPullRequest": True,
            "createdAt": created, "author": {"name": "user"}, "repo": {"name": repo, "type": "model"},
            "events": [], "filesWithConflicts": [], "changes": {"base": pr["base"]}, "diff": "",
        })

    def do_model_info(self, repo: str, rev: str = "main") -> None:
        repository = self.hub.get_repo(repo, authorized=self._authorized())
        commit = self.hub.resolve(repository, rev)
        modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.created))
        self._json({
            "id": repo, "modelId": repo, "sha": commit.sha, "private": repository.private,
            "lastModified": modified, "library_name": "cl-zoo", "tags": [],
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
        })

    def do_tree(self, repo: str, rev: str, path: str = "") -> None:
        repository = self.hub.get_repo(repo, authorized=self._authorized())
        commit = self.hub.resolve(repository, rev)
        recursive = self.query.get("recursive", "false").lower() in ("1", "true")
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        entries: dict[str, dict[str, Any]] = {}
        for file_path, blob in sorted(commit.files.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix):]
            parts = rest.split("/")
            for depth in range(1, len(parts)):  # folders on the way
                folder = prefix + "/".join(parts[:depth])
                if recursive or depth == 1:
                    entries.setdefault(folder, {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0})
                if not recursive:
                    break
            if recursive or len(parts) == 1:
                size = (self.hub.blob_dir / blob).stat().st_size
                entries[file_path] = {"type": "file", "path": file_path, "oid": blob, "size": size}
        self._json(list(entries.values()))

    def do_resolve(self, repo: str, rev: str, path: str) -> None:
        repository = self.hub.get_repo(repo, authorized=self._authorized())
        commit = self.hub.resolve(repository, rev)
        if path not in commit.files:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        data = self.hub.read_blob(commit.files[path])
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{commit.files[path]}"')
        self.send_header("X-Repo-Commit", commit.sha)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)


def online(monkeypatch: Any) -> None:
    """Let this process reach the fake Hub even when it started with HF_HUB_OFFLINE=1 (as CI does).

    ``huggingface_hub`` freezes HF_HUB_OFFLINE when it is first imported and ``HfApi`` checks that
    frozen value before every request, so setting the variable alone works only if no earlier test
    imported it. cl-zoo itself re-reads the variable on each call, so a test that sets it to 1
    later still exercises cl-zoo's offline path.
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@contextlib.contextmanager
def serve(tmp_path: Path, monkeypatch: Any, token: str | None = "hf_test_token", **env: str) -> Iterator[FakeHub]:
    """A FakeHub for one test, with the environment ``huggingface_hub`` and cl-zoo read pointed at it
    (endpoint, a fresh cache, the token, online, no progress bars) plus ``env``; ``monkeypatch``
    undoes it all."""
    with FakeHub(tmp_path / "hub-storage", **({"token": token} if token else {})) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        online(monkeypatch)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield server


def main(argv: list[str] | None = None) -> int:
    """Run the fake Hub as a process (``.ci/wheel`` serves a wheel venv from it): prints the endpoint
    to ``--endpoint-file`` once listening and serves until it is terminated or ``--seconds`` pass."""
    import argparse

    parser = argparse.ArgumentParser(description="a local stand-in for the Hugging Face Hub (127.0.0.1 only)")
    parser.add_argument("--root", type=Path, required=True, help="folder for its blobs")
    parser.add_argument("--token", default="hf_test_token", help="the write token it accepts")
    parser.add_argument("--endpoint-file", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=1800.0, help="stop by itself after this long")
    args = parser.parse_args(argv)
    with FakeHub(args.root, token=args.token) as hub:
        tmp = args.endpoint_file.with_suffix(".tmp")
        tmp.write_text(hub.endpoint + "\n")
        tmp.replace(args.endpoint_file)
        time.sleep(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
