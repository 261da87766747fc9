"""`grpo reward-serve`: the routes (FastAPI + uvicorn) of grpocli/wire/rewards.py's protocol, the
rewards named on the command line with the args the operator fixed for them
(grpocli.reward_server.fixed), and ``run_server``, which the CLI calls.

/score hands each request to the main thread's reward calls (grpocli.reward_server.calls) and
answers what the call gave. An unknown reward answers 404 naming those served; a request of
another protocol version or that does not fit 422 naming the field; args that do not repeat the
server's 403 naming the key; without the API key 401, from the headers before the body is read
(every path needs it when the server has one); a body over ``--max-body-mb`` 413. The port is
bound before any reward loads, and ``serving http://HOST:PORT`` is printed once requests are
answered (port 0 picks one).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response

from grpocli.errors import UserError
from grpocli.reward_server.calls import Calls, Served, call_args, rebuilt_state, takes_state
from grpocli.reward_server.fixed import fixed_args, parse_options
from grpocli.serving.access import DEFAULT_MAX_BODY, LOOPBACK, add_error_handlers, guard, key_check
from grpocli.wire.rewards import HEALTH_PATH, INFO_PATH, KEY_ENV, PROTOCOL_VERSION, SCORE_PATH, ScoreRequest

DEFAULT_PORT = 8100


def build_app(served: dict[str, Served], calls: Calls, *, api_key: str | None = None,
              max_body: int | None = DEFAULT_MAX_BODY) -> Any:
    """The FastAPI app; requests to /score become jobs of ``calls``."""
    app = FastAPI(title="grpo reward-serve", version=str(PROTOCOL_VERSION),
                  dependencies=[Depends(key_check(api_key, env=KEY_ENV))])
    add_error_handlers(app)

    @app.get(HEALTH_PATH)
    def health() -> dict[str, Any]:
        return {"status": "ok", "rewards": list(served)}

    @app.get(INFO_PATH)
    def info() -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "rewards": {k: s.description for k, s in served.items()},
                "args": {k: s.args().described() for k, s in served.items()}, "timeout": calls.timeout}

    @app.post(SCORE_PATH)
    async def score(req: ScoreRequest) -> Any:
        if req.protocol != PROTOCOL_VERSION:
            return JSONResponse(status_code=422, content={"detail": f"protocol {req.protocol}; this server speaks "
                                                          f"{PROTOCOL_VERSION}: use grpo train of the same version"})
        if req.reward not in served:
            return JSONResponse(status_code=404, content={"detail": f"no reward {req.reward!r} here; served: "
                                                          f"{', '.join(served)}"})
        args = call_args(served[req.reward], req)  # refused here, not after the calls queued before it
        status, body = await asyncio.wrap_future(calls.submit(served[req.reward], req, args))
        # Python's JSON (NaN allowed: the client reads it as Python does), not starlette's strict one
        return Response(content=json.dumps(body), status_code=status, media_type="application/json")

    guard(app, api_key, env=KEY_ENV, max_body=max_body)
    return app


def load_rewards(names: list[str], args: Sequence[str] = (), allow: Sequence[str] = ()) -> dict[str, Served]:
    """The rewards named on the command line, resolved as [[rewards]] names are, with the args of
    ``--args`` and ``--allow`` checked (UserError otherwise)."""
    from grpocli.recipe.schema import RewardSpec
    from grpocli.registry import load_plugins
    from grpocli.rewards.factories import is_factory
    from grpocli.rewards.references import lookup

    registry = load_plugins().rewards
    served: dict[str, Served] = {}
    for i, name in enumerate(names):
        found = lookup(RewardSpec(name=name), i, registry)
        if found.kind == "function" and is_factory(found.fn):
            raise UserError(f"{name} makes a reward from args (a factory); a server serves the reward itself",
                            where=f"REWARD {name}", valid="a reward fn(prompts, completions, **kwargs)",
                            hint="write a module-level reward that calls the factory once, and serve that")
        if name in served:
            raise UserError(f"{name} is named twice", where="REWARD...", valid="distinct rewards")
        doc = (getattr(found.fn, "__doc__", None) or "").strip().splitlines()
        served[name] = Served(name, found.fn, doc[0] if doc else "")
    fixed, allowed = parse_options(list(args), "--args", names), parse_options(list(allow), "--allow", names)
    for name, s in served.items():
        served[name] = Served(name, s.fn, s.description, fixed_args(name, s.fn, fixed.get(name, {}),
                                                                     allowed.get(name, {})))
    return served


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), before anything loads; UserError if busy."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}", where="--host/--port",
                        valid="a free port on an address of this machine",
                        hint=f"pick another port: grpo reward-serve ... --port {port + 1} (or 0: any free one)") from None
    sock.listen(128)  # connections wait here while the rewards load
    return sock


def run_server(names: list[str], host: str = "127.0.0.1", port: int = DEFAULT_PORT, api_key: str | None = None,
               timeout: float | None = None, *, args: Sequence[str] = (), allow: Sequence[str] = (),
               max_body: int | None = DEFAULT_MAX_BODY) -> None:
    """Serve ``names`` until SIGINT or SIGTERM (module docstring); ``args`` and ``allow``: the values
    of ``--args`` and ``--allow`` (grpocli.reward_server.fixed)."""
    import uvicorn

    sock = bound_socket(host, port)
    if host not in LOOPBACK:
        print(f"warning: grpo reward-serve listens on {host}, reachable from other machines"
              + ("" if api_key else " and without --api-key: anyone who can reach the port can call the rewards"
                 " (code.tests runs the code they send, as this server's user)"),
              file=sys.stderr, flush=True)
    elif not api_key:
        print("note: grpo reward-serve has no --api-key: any user of this machine can call the rewards (code.tests "
              "runs the code they send, as this server's user)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    served = load_rewards(names, args, allow)
    if any(takes_state(s.fn) for s in served.values()):  # transformers (for their TrainerState) imports
        threading.Thread(target=rebuilt_state, args=(None,), name="grpo-import", daemon=True).start()  # meanwhile
    calls = Calls(timeout)
    app = build_app(served, calls, api_key=api_key, max_body=max_body)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="grpo-reward-http", daemon=True)
    thread.start()
    shown = f"[{host}]" if ":" in host else host
    print(f"grpo reward-serve: {', '.join(served)} loaded in {time.perf_counter() - t0:.1f} s; serving "
          f"http://{shown}:{sock.getsockname()[1]} (protocol {PROTOCOL_VERSION})", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        calls.run(thread.is_alive)
    except KeyboardInterrupt:
        pass
    finally:
        stopped_itself = not thread.is_alive()
        server.should_exit = True
        thread.join(10)
    if stopped_itself:  # uvicorn ended without being asked: its own error is above this line
        print("grpo reward-serve: the HTTP server stopped on its own; exiting", file=sys.stderr, flush=True)
        sys.exit(1)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the one exception reward invocation lets through


__all__ = ["DEFAULT_PORT", "bound_socket", "build_app", "load_rewards", "run_server"]
