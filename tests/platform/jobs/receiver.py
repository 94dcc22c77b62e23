"""A webhook receiver for the tests: a real HTTP server on loopback that checks signatures the
way the API docs tell a user to (the `receiver` fixture, tests/platform/jobs/conftest.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rest_framework.test import APIClient


class Receiver:
    """A real HTTP endpoint on a free loopback port; it records every request (`requests`:
    method, path, Host) and each delivery, verified with the documented scheme:
    `X-Ringside-Signature: sha256=<HMAC-SHA256 of the raw body under the webhook's secret,
    hex>`. It answers 200, or what `answers` holds for the path: a status, or a status and
    the Location it redirects to."""

    def __init__(self):
        self.deliveries: list[dict] = []
        self.requests: list[tuple[str, str, str]] = []
        self.secrets: dict[str, str] = {}  # path -> secret
        self.answers: dict[str, int | tuple[int, str]] = {}  # path -> status (, Location)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                receiver.requests.append(("GET", self.path, self.headers["Host"]))
                self.answer()

            def do_POST(self):  # noqa: N802
                receiver.requests.append(("POST", self.path, self.headers["Host"]))
                body = self.rfile.read(int(self.headers["Content-Length"]))
                secret = receiver.secrets.get(self.path, "")
                expected = "sha256=" + hmac.new(secret.encode(), body,
                                                hashlib.sha256).hexdigest()
                receiver.deliveries.append({
                    "path": self.path, "event": self.headers["X-Ringside-Event"],
                    "verified": hmac.compare_digest(expected,
                                                    self.headers["X-Ringside-Signature"]),
                    "body": json.loads(body)})
                self.answer()

            def answer(self):
                status, location = receiver.answer_for(self.path)
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer_for(self, path: str) -> tuple[int, str | None]:
        answer = self.answers.get(path, 200)
        return answer if isinstance(answer, tuple) else (answer, None)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def subscribe(api: APIClient, receiver: Receiver, path: str, **body) -> dict:
    created = api.post("/api/webhooks/", {"url": receiver.url + path, **body}, format="json")
    assert created.status_code == 201, created.json()
    hook = created.json()
    receiver.secrets[path] = hook["secret"]
    return hook
