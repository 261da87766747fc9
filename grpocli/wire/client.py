"""The one HTTP client of grpo's servers (vllm-serve, ref-serve, reward-serve), on httpx.

``Client(url, timeout=..., api_key=...)`` sends a pydantic request model, a JSON value or raw bytes
(``send``: the answer's bytes and headers; ``call``: the answer as JSON, or checked by a pydantic
answer model), the API key as ``Authorization: Bearer KEY``. Its failures are three exceptions,
for each client to word with its own server's name and hints:

    Refused      the server answered an HTTP error status: ``status``, ``detail`` (the server's
                 FastAPI "detail" or vLLM's error message as text, else the status's reason phrase) and ``answer`` (the body
                 as JSON, None if it was none)
    Unavailable  no answer: the connection refused, reset or cut short, or the time up (``timed_out``)
    BadAnswer    an answer that breaks the protocol: not JSON, or not the answer model (``field``, ``what``)

The timeout bounds the whole call, the answer's last byte included: httpx's own timeouts bound
each connect, write and read, not their sum, so a server that trickles a byte at a time could hold a
call forever; at the deadline this client shuts the call's socket down. Every call opens its own
connection (as urllib did): no kept-alive connection that the server closed meanwhile fails a call
to a healthy server, which a fleet would then drop. ``retries``: how often a connection that
cannot be opened is tried again (httpx's transport retries; none by default).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

Answer = TypeVar("Answer", bound=BaseModel)
JSON = "application/json"
BYTES = "application/octet-stream"


class Refused(Exception):
    """The server answered ``method path`` with an HTTP error status (4xx, 5xx)."""

    def __init__(self, method: str, path: str, status: int, detail: str, answer: Any = None) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.method, self.path, self.status, self.detail, self.answer = method, path, status, detail, answer


class Unavailable(Exception):
    """No answer: ``reason`` says why; ``timed_out`` when the call's time was up."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.timed_out = reason, timed_out


class BadAnswer(ValueError):
    """An answer that breaks the protocol: ``what`` it held at ``field``."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")
        self.field, self.what = field, what


@dataclass(frozen=True)
class Reply:
    """A successful answer: its body and its headers (names in lower case)."""

    content: bytes
    headers: dict[str, str]


class Client:
    """Calls to the server at ``url``, each bounded by ``timeout`` seconds (None: no limit)."""

    def __init__(self, url: str, *, timeout: float | None, api_key: str | None = None, retries: int = 0) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.api_key = timeout, api_key
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection per call (module docstring)
        self._http = httpx.Client(limits=limits, transport=httpx.HTTPTransport(limits=limits, retries=retries))

    def call(self, method: str, path: str, body: BaseModel | dict | bytes | None = None, *,
             answer: type[Answer] | None = None, timeout: float | None = None) -> Any:
        """The answer as JSON (None for an empty body), or as ``answer`` (BadAnswer if it is not one)."""
        content = self.send(method, path, body, timeout=timeout).content
        if answer is not None:
            return read_answer(answer, content)
        try:
            return json.loads(content or b"null")
        except ValueError:
            raise BadAnswer("the body", f"something that is not JSON: {shortened(content)}") from None

    def send(self, method: str, path: str, body: BaseModel | dict | bytes | None = None, *,
             timeout: float | None = None, content_type: str | None = None) -> Reply:
        """One call: ``body`` a request model or a JSON value (sent as JSON), or bytes (``content_type``,
        octet-stream by default). Refused for an error status, Unavailable for no answer in time."""
        timeout = self.timeout if timeout is None else timeout
        content, kind = encoded(body)
        headers = {"Accept": JSON, **({"Content-Type": content_type or kind} if content is not None else {})}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        deadline = Deadline(timeout)
        try:
            with self._http.stream(method, self.url + path, content=content, headers=headers, timeout=timeout,
                                   extensions={"trace": deadline.trace}) as response:
                data = response.read()
        except httpx.RequestError as exc:  # connect, write, read: refused, reset, cut short, timed out
            if timeout is not None and (deadline.expired or isinstance(exc, httpx.TimeoutException)):
                raise Unavailable(f"no answer within {timeout:g} s", timed_out=True) from None
            raise Unavailable(reason(exc)) from None
        finally:
            deadline.stop()
        if response.status_code >= 400:
            raise refusal(method, path, response.status_code, response.reason_phrase, data)
        return Reply(data, {k.lower(): v for k, v in response.headers.items()})

    def close(self) -> None:
        self._http.close()


class Deadline:
    """The end of one call, ``seconds`` from now: then it shuts the call's sockets down (``trace``
    learns them from httpcore as they connect), which ends any read or write still waiting on them."""

    def __init__(self, seconds: float | None) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = None if seconds is None else threading.Timer(seconds, self.cut)
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            with self._lock:
                self._sockets.append(sock)
                late = self.expired
            if late:  # connected after the deadline
                self.cut()

    def cut(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """The call ended: no cut."""
        if self._timer is not None:
            self._timer.cancel()


def encoded(body: BaseModel | dict | bytes | None) -> tuple[bytes | None, str]:
    """(the bytes to send, their content type) of a request body."""
    if body is None:
        return None, JSON
    if isinstance(body, bytes):
        return body, BYTES
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode(), JSON
    return json.dumps(body).encode(), JSON


def read_answer(model: type[Answer], content: bytes | Any) -> Answer:
    """``content`` (JSON bytes, or a JSON value already read) as ``model``; BadAnswer naming the first
    field that does not fit."""
    try:
        return model.model_validate_json(content) if isinstance(content, bytes) else model.model_validate(content)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "json_invalid":
            raise BadAnswer("the body", f"something that is not JSON: {shortened(content)}") from None
        field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        raise BadAnswer(field.lstrip(".") or "the body",
                        f"{error['msg'].lower()} (got {shortened(error.get('input'))})") from None


def refusal(method: str, path: str, status: int, phrase: str, data: bytes) -> Refused:
    """Refused for an error status, with the server's "detail" (FastAPI's) or "error"."message" (vLLM's)
    as text, else the reason phrase."""
    try:
        answer = json.loads(data or b"null")
    except ValueError:
        answer = None
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if detail is None and isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        detail = answer["error"].get("message")
    if detail is not None and not isinstance(detail, str):
        detail = json.dumps(detail)
    return Refused(method, path, status, detail or phrase, answer)


def reason(exc: httpx.RequestError) -> str:
    """Why a call got no answer, in words (a refused connection says its errno)."""
    said = str(exc) or type(exc).__name__
    return said if isinstance(exc, httpx.ConnectError) else f"{type(exc).__name__}: {said}"


def shortened(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["BYTES", "JSON", "BadAnswer", "Client", "Deadline", "Refused", "Reply", "Unavailable", "read_answer",
           "shortened"]
