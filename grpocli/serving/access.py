"""Who may call a grpo server and what it hears back: the API key, errors as JSON, the port check.

Shared by `grpo vllm-serve` (grpocli.server.app), `grpo ref-serve` (grpocli.reference.app) and
`grpo reward-serve` (grpocli.reward_server.app). Light imports only (fastapi, no torch), so a reward
server starts in a second.
"""

from __future__ import annotations

import hmac
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


def key_check(api_key: str | None, *, env: str) -> Any:
    """A dependency that refuses (401) a request without ``api_key``; lets all through without one.
    ``env`` names the variable grpo train reads the key from."""
    def check(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        got = request.headers.get("x-api-key") or (auth[7:] if auth.lower().startswith("bearer ") else "")
        if not got or not hmac.compare_digest(got.encode(), api_key.encode()):
            raise HTTPException(401, "this endpoint needs the server's API key: send 'Authorization: Bearer KEY' "
                                     f"or 'X-API-Key: KEY' (grpo train reads it from {env})")

    return check


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


__all__ = ["LOOPBACK", "ServerError", "add_error_handlers", "check_port", "key_check"]
