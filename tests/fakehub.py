"""A stand-in for the Hugging Face Hub on 127.0.0.1: serves `<root>/<org>/<name>/` folders as model repos.

It answers exactly the routes huggingface_hub 2.4 uses for downloads (see docs of dev-env §5): repo info
(`/api/models/{repo}[/revision/{rev}]`, with sizes when `blobs=True`), the tree listing, `resolve` with HEAD,
GET and Range, and `/api/agent-harnesses`. Files ending in .safetensors/.bin/.pt are served as LFS files
(ETag = sha256, X-Linked-Etag/X-Linked-Size), the rest with git blob ids, like the real Hub.

For tests it logs every request and can cut a file's download short (a dropped connection), optionally
refusing that file afterwards until `heal()` (a network that stays down), or `stall()`: accept every
connection and never answer, until `heal()` or `stop()` (a Hub behind a broken proxy).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class LoggedRequest:
    method: str
    path: str
    range: str | None


@dataclass
class Interruption:
    after_bytes: int
    then_fail: bool
    fired: bool = False


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    root: Path
    requests: list[LoggedRequest] = field(default_factory=list)
    interruptions: dict[str, Interruption] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None
    stalled: bool = False
    _thread: threading.Thread | None = None
    _release: threading.Event = field(default_factory=threading.Event)

    # ---- repos -------------------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, folder: Path | None = None, extra: dict[str, bytes] | None = None) -> Path:
        """Publish a copy of `folder` (plus `extra` files) as `repo_id`."""
        target = self.root / repo_id
        if folder is not None:
            shutil.copytree(folder, target, dirs_exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        for name, data in (extra or {}).items():
            (target / name).write_bytes(data)
        return target

    def files(self, repo_id: str) -> dict[str, bytes]:
        folder = self.root / repo_id
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    def commit(self, repo_id: str) -> str:
        """A stable 40-hex commit id that changes whenever a file changes."""
        digest = hashlib.sha1()
        for name, data in self.files(repo_id).items():
            digest.update(name.encode() + b"\0" + git_blob_id(data).encode())
        return digest.hexdigest()

    def entry(self, name: str, data: bytes) -> dict:
        item = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return item

    # ---- test controls -----------------------------------------------------------------------------------
    def interrupt(self, filename: str, after_bytes: int, then_fail: bool = False) -> None:
        """The next GET of `filename` sends `after_bytes` bytes then drops the connection."""
        self.interruptions[filename] = Interruption(after_bytes, then_fail)

    def heal(self) -> None:
        self.interruptions.clear()
        self.stalled = False
        self._release.set()

    def stall(self) -> None:
        """From now on every request is read and never answered (the connection stays open)."""
        self._release.clear()
        self.stalled = True

    def gets(self, suffix: str = "") -> list[LoggedRequest]:
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(suffix)]

    # ---- server ------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # stalled handlers let go of their connections
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


REPO = r"(?P<repo>[^/]+/[^/]+)"


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, format, *args) -> None:  # keep pytest output clean
        pass

    def do_HEAD(self) -> None:
        self.route(head=True)

    def do_GET(self) -> None:
        self.route(head=False)

    def route(self, head: bool) -> None:
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        self.hub.requests.append(LoggedRequest(self.command, path, self.headers.get("Range")))
        if self.hub.stalled:
            self.hub._release.wait()
            self.close_connection = True
            return
        if path == "/api/agent-harnesses":  # a dict, never a list (the client calls .get on it)
            return self.send_json({"standardEnvVars": [], "harnesses": {}})
        if m := re.fullmatch(rf"/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?", path):
            return self.repo_info(m["repo"], m["rev"] or "main", query.get("blobs", ["false"])[0].lower() == "true")
        if m := re.fullmatch(rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?", path):
            return self.tree(m["repo"], m["rev"], (m["sub"] or "").strip("/"))
        if m := re.fullmatch(rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)", path):
            return self.resolve(m["repo"], m["rev"], m["file"], head)
        self.send_error_code(404, "RepoNotFound")

    # ---- routes ------------------------------------------------------------------------------------------
    def known(self, repo: str, rev: str) -> bool:
        if not (self.hub.root / repo).is_dir():
            self.send_error_code(404, "RepoNotFound")
            return False
        if rev not in ("main", self.hub.commit(repo)):
            self.send_error_code(404, "RevisionNotFound")
            return False
        return True

    def repo_info(self, repo: str, rev: str, blobs: bool) -> None:
        if not self.known(repo, rev):
            return
        siblings = []
        for name, data in self.hub.files(repo).items():
            sibling = {"rfilename": name}
            if blobs:
                entry = self.hub.entry(name, data)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"], "pointerSize": 134}
            siblings.append(sibling)
        self.send_json({"id": repo, "modelId": repo, "sha": self.hub.commit(repo), "private": False,
                        "siblings": siblings, "tags": [], "downloads": 0, "likes": 0})

    def tree(self, repo: str, rev: str, sub: str) -> None:
        if not self.known(repo, rev):
            return
        entries = [self.hub.entry(name, data) for name, data in self.hub.files(repo).items()
                   if not sub or name.startswith(sub + "/")]
        self.send_json(entries)

    def resolve(self, repo: str, rev: str, name: str, head: bool) -> None:
        if not self.known(repo, rev):
            return
        data = self.hub.files(repo).get(name)
        if data is None:
            return self.send_error_code(404, "EntryNotFound", commit=self.hub.commit(repo))
        cut = self.hub.interruptions.get(name)
        if cut is not None and cut.fired and cut.then_fail and not head:
            return self.send_error_code(503, "ServiceUnavailable")
        entry = self.hub.entry(name, data)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        start, status = 0, 200
        if (wanted := self.headers.get("Range")) and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())):
            start, stop = int(m[1]), int(m[2]) if m[2] else len(data) - 1
            status, body = 206, data[start: stop + 1]
        else:
            body = data
        self.send_response(status)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", self.hub.commit(repo))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if cut is not None and not cut.fired:  # send part of the body, then drop the connection
            cut.fired = True
            self.wfile.write(body[: cut.after_bytes])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)

    # ---- helpers -----------------------------------------------------------------------------------------
    def send_json(self, value) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error_code(self, status: int, code: str, commit: str | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
