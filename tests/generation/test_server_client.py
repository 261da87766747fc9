"""grpocli.generation.server_client against a real stdlib HTTP server on 127.0.0.1 that answers what
each test sets (no vLLM): which failures a fleet may drop a server for (ServerUnavailable: no answer,
5xx) and which it may not (a 4xx, an answer outside the protocol), each a UserError naming the URL."""

from __future__ import annotations

import http.server
import threading

import pytest

from grpocli.errors import UserError
from grpocli.generation.base import Sampling
from grpocli.generation.server_client import ServerClient, ServerUnavailable


class Canned(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, body = self.server.reply  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def canned():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _generate(url: str):
    return ServerClient(url, timeout=10).generate([[5, 6]], 2, Sampling(max_tokens=4), seed=[7])


def test_an_answer_is_read_through_its_model(canned):
    canned.reply = (200, (b'{"choices": [{"index": 1, "token_ids": [2, 3], "finish_reason": "length", "logprobs": '
                          b'{"token_logprobs": [-1.0, -2.0]}}, {"index": 0, "token_ids": [1], "finish_reason": "stop", '
                          b'"logprobs": {"token_logprobs": [-0.5]}}], "usage": {}}'))
    out = _generate(canned.url)
    assert out.completion_ids == [[1], [2, 3]] and out.truncated == [False, True] and out.logprobs[1] == [-1.0, -2.0]


@pytest.mark.parametrize(("status", "body", "kind", "needles"), [
    (401, b'{"detail": "this endpoint needs the server\'s API key"}', UserError,
     ["refused /v1/completions: HTTP 401: this endpoint needs", "export GRPO_VLLM_API_KEY="]),
    (400, b'{"error": {"message": "n must be at least 1", "code": 400}}', UserError,  # vLLM's own error shape
     ["HTTP 400: n must be at least 1"]),
    (503, b'{"detail": "the weights are not one complete version: ..."}', ServerUnavailable,
     ["HTTP 503: the weights are not one complete version", "the next complete one repairs them"]),
    (200, b'{"choices": "none"}', UserError,
     ["answered POST /v1/completions outside its protocol", "choices of the answer"]),
])
def test_failures_say_the_server_and_whether_a_fleet_may_drop_it(canned, status, body, kind, needles):
    canned.reply = (status, body)
    with pytest.raises(UserError) as err:
        _generate(canned.url)
    assert type(err.value) is kind, err.value.render()
    text = err.value.render()
    assert canned.url in text and all(n in text for n in needles), text
