"""A real HTTP proxy on 127.0.0.1 in front of one vLLM server that keeps every /v1/completions body
(one prompt's n samples each): what the trainer's client sent (its seeds, how it split the prompts),
seen from outside."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordingProxy:
    """Forwards every request to ``target`` (content type and API key kept); ``url`` is its own."""

    def __init__(self, target: str, *, timeout: float = 180) -> None:
        bodies = self.bodies = []
        paths = self.paths = []  # (method, path) of every request, in order

        class Forward(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                paths.append(("GET", self.path))
                self.forward(None)

            def do_POST(self) -> None:
                paths.append(("POST", self.path))
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/completions":
                    bodies.append(json.loads(data))
                self.forward(data)

            def forward(self, data) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                req = urllib.request.Request(target + self.path, data=data, headers=headers, method=self.command)
                try:
                    with urllib.request.urlopen(req, timeout=timeout) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, payload = err.code, err.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def taken(self) -> list[dict]:
        """The /v1/completions bodies since the last call, in the prompts' order of arrival (then forgotten)."""
        out, self.bodies[:] = list(self.bodies), []
        return out

    def seeds(self) -> list:
        """The seed of each /v1/completions since the last call (then forgotten)."""
        return [body["seed"] for body in self.taken()]
