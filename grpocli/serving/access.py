"""Who may call a grpo server and what it hears back: the API key, errors as JSON, the port check.

Shared by `grpo ref-serve` (grpocli.reference.app), `grpo reward-serve` (grpocli.reward_server.app)
and the middleware `grpo vllm-serve` adds to stock vLLM (grpocli.server.guard). Light imports only (fastapi, no torch), so a reward
server starts in a second.

Which routes need the key is declared once, by the ``key_check`` dependency on them (or on the whole
app). ``guard`` reads those declarations and puts ``KeyFirst`` in front of the app: a pure ASGI
middleware that refuses a request without the key (401) from its headers alone, before a byte of
its body is read (FastAPI runs dependencies only after it has read and parsed a pydantic body: a
100 MB body without a key grew reward-serve by ~600 MB before its 401), and bounds each path's body
(413, from Content-Length at once, else as it arrives).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServerError(Exception):
    """An answer with an HTTP status and a reason (4xx: the request; 5xx: the engine)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def add_error_handlers(app: Any) -> None:
    """Errors as JSON: a ServerError with its status, a 422 listing each invalid field (without
    echoing the input, which may not be JSON: NaN), anything else a 500 naming the exception."""

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": exc.reason})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [
            {"loc": [str(part) for part in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()]})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})


#: The largest request body a path takes unless its server says otherwise (``guard``'s ``max_body``).
DEFAULT_MAX_BODY = 256 * 2**20


def key_reason(env: str) -> str:
    return ("this endpoint needs the server's API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY' "
            f"(grpo train reads it from {env})")


def has_key(api_key: str, authorization: str, x_api_key: str) -> bool:
    """Whether the headers carry ``api_key`` (compared in constant time)."""
    got = x_api_key or (authorization[7:] if authorization.lower().startswith("bearer ") else "")
    return bool(got) and hmac.compare_digest(got.encode(), api_key.encode())


def key_check(api_key: str | None, *, env: str) -> Any:
    """A dependency that refuses (401) a request without ``api_key``; lets all through without one.
    ``env`` names the variable grpo train reads the key from. It marks the routes (or the app) that
    need the key: ``guard`` checks them before their body is read."""
    def check(request: Request) -> None:
        if api_key is not None and not has_key(api_key, request.headers.get("authorization", ""),
                                               request.headers.get("x-api-key", "")):
            raise HTTPException(401, key_reason(env))

    check.grpo_api_key = True  # type: ignore[attr-defined]
    return check


def guard(app: Any, api_key: str | None, *, env: str, max_body: int | None = DEFAULT_MAX_BODY,
          limits: Mapping[str, int | None] | None = None) -> None:
    """Put ``KeyFirst`` in front of ``app`` (a FastAPI app whose routes are all added): the key checked
    on every path except the routes declared without ``key_check`` (an unknown path needs it too), and
    each path's body bounded by ``limits[path]``, else ``max_body`` (None: no bound)."""
    keyed = any(_marks_key(d) for d in app.router.dependencies)
    open_paths = frozenset() if keyed else frozenset(
        route.path for route in app.routes
        if hasattr(route, "dependencies") and not any(_marks_key(d) for d in route.dependencies))
    app.add_middleware(KeyFirst, api_key=api_key, env=env, open_paths=open_paths, max_body=max_body,
                       limits=dict(limits or {}))


def _marks_key(depends: Any) -> bool:
    return getattr(getattr(depends, "dependency", None), "grpo_api_key", False)


class BodyTooLarge(Exception):
    """Raised into the app by KeyFirst's receive when a body passes its path's bound."""


class KeyFirst:
    """Pure ASGI middleware: the API key from the headers (401), then the body's size (413), before the
    app reads a byte of the body (``guard``)."""

    def __init__(self, app: Any, *, api_key: str | None, env: str, open_paths: frozenset[str],
                 max_body: int | None, limits: dict[str, int | None]) -> None:
        self.app, self.api_key, self.env, self.open_paths = app, api_key, env, open_paths
        self.max_body, self.limits = max_body, limits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                   if k.lower() in (b"authorization", b"x-api-key", b"content-length")}
        if self.api_key is not None and path not in self.open_paths and not has_key(
                self.api_key, headers.get("authorization", ""), headers.get("x-api-key", "")):
            await answer(send, 401, key_reason(self.env))
            return
        limit = self.limits.get(path, self.max_body)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await answer(send, 413, too_large(path, limit))
            return
        await self._bounded(scope, receive, send, limit)

    async def _bounded(self, scope: Any, receive: Any, send: Any, limit: int) -> None:
        """The app with a body counted as it arrives (chunked): past ``limit`` its read fails and the
        answer is a 413, whatever the app made of the failed read."""
        state = {"read": 0, "over": False, "started": False}

        async def bounded_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    state["over"] = True
                    raise BodyTooLarge(too_large(scope["path"], limit))
            return message

        async def checked_send(message: Any) -> None:
            if state["over"]:
                return  # the app's answer to a body it could not read: the 413 goes instead
            state["started"] = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, checked_send)
        except Exception:
            if not state["over"]:
                raise
        if state["over"] and not state["started"]:
            await answer(send, 413, too_large(scope["path"], limit))


def too_large(path: str, limit: int) -> str:
    return (f"the request body is larger than {path} takes ({limit / 2**20:g} MiB); send less per request"
            " (or start the server with a larger bound, where it has one)")


async def answer(send: Any, status: int, detail: str) -> None:
    """A JSON error answer ``{"detail": ...}`` sent straight through ASGI; the connection is closed
    after it (the body, unread, is not waited for)."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def check_port(host: str, port: int, *, command: str) -> None:
    """UserError (exit 2) before any model loads when ``host:port`` cannot be listened on."""
    import socket

    from grpocli.errors import UserError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}", where="--host/--port",
                            valid="a free port on an address of this machine",
                            hint=f"pick another port: {command} --model ... --port {port + 1}") from None


__all__ = ["DEFAULT_MAX_BODY", "LOOPBACK", "KeyFirst", "ServerError", "add_error_handlers", "check_port", "guard",
           "key_check"]
