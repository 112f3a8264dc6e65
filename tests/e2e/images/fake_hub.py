"""A minimal Hugging Face Hub stand-in on 127.0.0.1 for the image's `models-hub` stage (`hf download` through
HF_ENDPOINT): the repo tree listing and file resolution of pinned commits, nothing else. It records the
Authorization header of every request so a test can prove the build secret reached the download."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """repos: {repo_id: (commit, {filename: bytes})}. Use as a context manager; `url` is the HF_ENDPOINT."""

    def __init__(self, repos: Mapping[str, tuple[str, Mapping[str, bytes]]]) -> None:
        self.repos = repos
        self.authorization: list[str | None] = []
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _lookup(self, repo: str, rev: str) -> Mapping[str, bytes] | None:
        found = self.repos.get(repo)
        return found[1] if found and found[0] == rev else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def send(self, code: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                hub.authorization.append(self.headers.get("Authorization"))
                hub.requests.append(f"{self.command} {self.path}")
                parts = unquote(urlparse(self.path).path).strip("/").split("/")
                if parts[:2] == ["api", "models"] and "tree" in parts:
                    i = parts.index("tree")
                    files = hub._lookup("/".join(parts[2:i]), parts[i + 1])
                    if files is None:
                        return self.send(404, b'{"error": "not found"}', {"X-Error-Code": "RevisionNotFound"})
                    listing = [
                        {"type": "file", "path": n, "size": len(d), "oid": git_blob_id(d)} for n, d in files.items()
                    ]
                    return self.send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"})
                if "resolve" in parts:
                    i = parts.index("resolve")
                    files = hub._lookup("/".join(parts[:i]), parts[i + 1])
                    name = "/".join(parts[i + 2 :])
                    if files is None or name not in files:
                        return self.send(404, b"", {"X-Error-Code": "EntryNotFound"})
                    data = files[name]
                    headers = {"X-Repo-Commit": parts[i + 1], "ETag": f'"{git_blob_id(data)}"'}
                    return self.send(200, data, {**headers, "Content-Type": "application/octet-stream"})
                return self.send(404)

            do_HEAD = do_GET

        return Handler
