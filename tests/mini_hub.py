"""The smallest honest Hugging Face hub for the cases olah cannot play: a repository that needs a token,
and a download that stalls mid-file (so a killed fetch can be resumed with an HTTP Range request).

It implements just the endpoints huggingface_hub's model_info / snapshot_download use:
  GET  /api/models/<org>/<name>/revision/<rev>      -> {"id", "sha", "siblings": [...], "pipeline_tag" when given}
  HEAD/GET /<org>/<name>/resolve/<rev>/<path>       -> the file, with ETag, X-Repo-Commit, Range support
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class MiniHub:
    def __init__(
        self, repo_id: str, files_from: Path, token: str | None = None, stall_file: str | None = None, pipeline_tag: str | None = None
    ):
        self.repo_id = repo_id
        self.pipeline_tag = pipeline_tag  # the hub's own tag of the repository (model_info().pipeline_tag)
        self.paths: list[str] = []  # every request's path, in order
        self.files = {str(p.relative_to(files_from)): p.read_bytes() for p in sorted(files_from.rglob("*")) if p.is_file()}
        self.token = token
        self.stall_file = stall_file  # first GET of this file sends half, then hangs until released
        self.release = threading.Event()
        self.half_sent = threading.Event()
        self.ranges: list[str] = []  # Range headers seen for stall_file
        self.authorizations: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> MiniHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def etag(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def _send(self, handler, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def handle(self, handler, head: bool) -> None:
        self.authorizations.append(handler.headers.get("Authorization", ""))
        if self.token and handler.headers.get("Authorization") != f"Bearer {self.token}":
            body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
            self._send(
                handler,
                401,
                body,
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found", "Content-Type": "application/json"},
                head,
            )
            return
        path = unquote(handler.path.split("?")[0])
        self.paths.append(path)
        info_prefix = f"/api/models/{self.repo_id}/revision/"
        file_prefix = f"/{self.repo_id}/resolve/"
        if path.startswith(info_prefix):
            siblings = [{"rfilename": name, "size": len(data), "blobId": self.etag(data)[:40]} for name, data in self.files.items()]
            info = {"id": self.repo_id, "modelId": self.repo_id, "sha": COMMIT, "siblings": siblings, "private": bool(self.token)}
            body = json.dumps({**info, "pipeline_tag": self.pipeline_tag} if self.pipeline_tag else info).encode()
            self._send(handler, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith(file_prefix):
            name = path[len(file_prefix) :].split("/", 1)[1]
            data = self.files.get(name)
            if data is None:
                self._send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)
                return
            headers = {"ETag": f'"{self.etag(data)}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
            if head:
                handler.send_response(200)
                for key, value in headers.items():
                    handler.send_header(key, value)
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                return
            start = 0
            range_header = handler.headers.get("Range")
            if name == self.stall_file:
                self.ranges.append(range_header or "")
            if range_header and range_header.startswith("bytes="):
                start = int(range_header[6:].split("-")[0] or 0)
            body = data[start:]
            handler.send_response(206 if start else 200)
            for key, value in headers.items():
                handler.send_header(key, value)
            if start:
                handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            if name == self.stall_file and not self.half_sent.is_set():
                handler.wfile.write(body[: len(body) // 2])
                handler.wfile.flush()
                self.half_sent.set()
                self.release.wait(120)  # the client is killed meanwhile
                return
            handler.wfile.write(body)
            return
        self._send(handler, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)


def wait_for(predicate, timeout: float = 60.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False
