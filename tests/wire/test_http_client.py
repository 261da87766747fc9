"""grpocli.wire.client, the one HTTP client of grpo's servers, against real servers on 127.0.0.1: a
stdlib HTTP server that answers what each test sets, a server that trickles its answer a byte at a
time, and a port nobody listens on."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest
from pydantic import BaseModel
from trickling_server import TricklingServer

from grpocli.wire.client import BadAnswer, Client, Refused, Unavailable


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's (status, body, content type); keeps what it was sent."""

    def do_GET(self) -> None:
        self.answer(b"")

    def do_POST(self) -> None:
        self.answer(self.rfile.read(int(self.headers["Content-Length"])))

    def answer(self, body: bytes) -> None:
        self.server.seen.append((self.command, self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        status, content = self.server.reply  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def echo():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    httpd.seen, httpd.reply = [], (200, b"{}")
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


class Pair(BaseModel):
    name: str
    values: list[int]


def test_json_and_models_go_out_with_the_key_and_answers_come_back_checked(echo):
    client = Client(echo.url + "/", timeout=10, api_key="k-123")
    echo.reply = (200, b'{"name": "a", "values": [1, 2]}')
    assert client.call("POST", "/x?y=1", Pair(name="q", values=[3]), answer=Pair) == Pair(name="a", values=[1, 2])
    assert client.call("POST", "/x", {"plain": [1.5, None]}) == {"name": "a", "values": [1, 2]}
    reply = client.send("POST", "/bytes", b"\x00\x01")
    assert reply.content == b'{"name": "a", "values": [1, 2]}' and reply.headers["content-type"] == "application/json"
    (m1, p1, h1, b1), (_, _, _, b2), (_, _, h3, b3) = echo.seen
    assert (m1, p1, json.loads(b1)) == ("POST", "/x?y=1", {"name": "q", "values": [3]})
    assert h1["Authorization"] == "Bearer k-123" and h1["Content-Type"] == "application/json"
    assert json.loads(b2) == {"plain": [1.5, None]}
    assert b3 == b"\x00\x01" and h3["Content-Type"] == "application/octet-stream"
    echo.reply = (200, b'{"name": "a", "values": [1, "two"]}')
    with pytest.raises(BadAnswer) as bad:
        client.call("GET", "/x", answer=Pair)
    assert bad.value.field == "values[1]" and "'two'" in bad.value.what
    echo.reply = (200, b"<html>")
    with pytest.raises(BadAnswer, match="something that is not JSON"):
        client.call("GET", "/x")


@pytest.mark.parametrize(("status", "body", "detail"), [
    (401, b'{"detail": "this endpoint needs the server\'s API key"}', "this endpoint needs the server's API key"),
    (422, b'{"detail": [{"loc": ["body", "n"], "msg": "too big"}]}', '[{"loc": ["body", "n"], "msg": "too big"}]'),
    (503, b"not json", "Service Unavailable"),
])
def test_an_error_status_is_refused_with_the_servers_detail(echo, status, body, detail):
    echo.reply = (status, body)
    with pytest.raises(Refused) as refused:
        Client(echo.url, timeout=10).call("POST", "/generate", {})
    assert (refused.value.status, refused.value.detail, refused.value.path) == (status, detail, "/generate")


def test_no_server_is_unavailable_not_timed_out():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(Unavailable) as gone:
        Client(url, timeout=5).call("GET", "/health")
    assert not gone.value.timed_out and "refused" in gone.value.reason.lower()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_the_timeout_bounds_the_whole_answer_of_a_server_that_trickles(part):
    """A byte every 0.1 s keeps each read short: only a deadline for the whole call ends it."""
    server = TricklingServer(part, every=0.1)
    try:
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as late:
            Client(server.url, timeout=1.0).call("POST", "/score", {"x": 1})
        took = time.monotonic() - t0
    finally:
        server.close()
    assert late.value.timed_out and late.value.reason == "no answer within 1 s"
    assert 0.9 < took < 2.5, took
