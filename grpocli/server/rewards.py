"""`grpo reward-serve`: rewards scored over HTTP (FastAPI + uvicorn), for [[rewards]] entries with ``url``.

The protocol (paths, ScoreRequest, ScoreAnswer) is grpocli/wire/rewards.py's; the trainer's side
is grpocli.rewards.remote.

Each request is one call of the reward on the batch it carries, with the keywords grpo gives a
reward in-process (grpocli.rewards.scoring.reward_kwargs: the columns by name, ``completion_ids``,
a ``transformers.TrainerState`` rebuilt from the fields sent, ``log_extra`` / ``log_metric``, the
entry's args), made through the same invocation (grpocli.rewards.invocation: async rewards on
their loop, ``--timeout`` per call, a sync reward that needs the main thread for its signal alarms,
math-verify's, in it). So calls run in the main thread, one at a time in arrival order, while uvicorn
serves in a thread of its own.

A reward's own failure answers 500 ``{"detail", "failure": "raised"}`` (its exception or timeout:
the client's on_error decides) or ``"failure": "invalid"`` (it returned no valid scores: a
UserError there, as in-process); an unknown reward 404 naming those served; a request that does
not fit 422 naming the field; without the API key 401. The port is bound before any reward
loads, and ``serving http://HOST:PORT`` is printed once requests are answered (port 0 picks one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response

from grpocli.errors import UserError
from grpocli.serving.access import LOOPBACK, add_error_handlers, key_check
from grpocli.wire.rewards import HEALTH_PATH, INFO_PATH, KEY_ENV, PROTOCOL_VERSION, SCORE_PATH, ScoreRequest, jsonable

DEFAULT_PORT = 8100
_import_lock = threading.Lock()


@dataclass(frozen=True)
class Served:
    """A reward this server scores: the name clients send, the callable, its description."""

    name: str
    fn: Any
    description: str = ""


class Calls:
    """Reward calls queued by the routes and run by ``run`` in the main thread, in order."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.jobs: queue.Queue[tuple[Served, ScoreRequest, concurrent.futures.Future]] = queue.Queue()

    def submit(self, served: Served, req: ScoreRequest) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((served, req, future))
        return future

    def run(self, alive: Any) -> None:
        """Answer queued calls until ``alive()`` turns false (the HTTP thread ended)."""
        while alive():
            try:
                served, req, future = self.jobs.get(timeout=1.0)
            except queue.Empty:
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(score_batch(served, req, self.timeout))
            except Exception as exc:  # noqa: BLE001 - grpo's own failure: answered, the server goes on
                future.set_result((500, {"detail": f"grpo reward-serve failed: {type(exc).__name__}: {exc}"}))


def score_batch(served: Served, req: ScoreRequest, timeout: float | None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of one call of ``served`` on the request's batch."""
    from grpocli.rewards.arguments import check_reward_args
    from grpocli.rewards.invocation import Failed, call_one
    from grpocli.rewards.scoring import RewardFn, RewardLog, check_values, reward_kwargs

    n = len(req.completions)
    lengths = {"prompts": len(req.prompts), **{f"columns.{k}": len(v) for k, v in req.columns.items()}}
    if req.completion_ids is not None:
        lengths["completion_ids"] = len(req.completion_ids)
    for key, size in lengths.items():
        if size != n:
            return 422, {"detail": f"{key} has {size} rows for {n} completions"}
    rf = RewardFn(served.name, served.fn, args=dict(req.args))
    log = RewardLog()
    # a TrainerState (transformers' import) only for a reward that takes it
    state = rebuilt_state(req.trainer_state) if takes_state(served.fn) else None
    context = {"trainer_state": state, "log_extra": log.log_extra, "log_metric": log.log_metric}
    try:
        check_reward_args(0, served.name, served.fn, req.args)
        kwargs = reward_kwargs(0, rf, req.prompts, req.completions, req.columns, req.completion_ids, context)
    except UserError as err:
        said = [err.what] + [f"{k}: {v}" for k, v in (("valid", err.valid), ("next", err.hint)) if v]
        return 422, {"detail": "; ".join(said)}
    t0 = time.perf_counter()
    outcome = call_one(served.fn, kwargs, timeout)
    if isinstance(outcome, Failed):
        return 500, {"detail": _described(outcome.exc), "failure": "raised"}
    try:
        scores = check_values(0, rf, outcome, n)
        logged = {"log_extra": jsonable(log.columns), "log_metric": jsonable(log.metrics)}
    except UserError as err:
        return 500, {"detail": err.what, "failure": "invalid"}
    except (TypeError, ValueError) as exc:
        return 500, {"detail": f"reward {served.name!r} logged values JSON cannot carry: {exc}", "failure": "invalid"}
    return 200, {"scores": scores, **logged, "seconds": round(time.perf_counter() - t0, 6)}


def takes_state(fn: Any) -> bool:
    """Whether ``fn`` gets the trainer_state keyword (it names it, or takes **kwargs)."""
    from grpocli.rewards.invocation import keyword_names

    names = keyword_names(fn)
    return names is None or "trainer_state" in names


def rebuilt_state(fields: dict[str, Any] | None) -> Any:
    """A ``transformers.TrainerState`` from the fields the client sent (its defaults for the others)."""
    import dataclasses

    with _import_lock:  # transformers' lazy import is not safe from two threads at once
        from transformers import TrainerState

    if fields is None:
        return TrainerState()
    known = {f.name for f in dataclasses.fields(TrainerState)}
    return TrainerState(**{k: v for k, v in fields.items() if k in known})


def _described(exc: BaseException) -> str:
    from grpocli.rewards.invocation import RewardTimeout, raised_at

    if isinstance(exc, RewardTimeout):
        return f"timed out: {exc}" + (f" (waiting at {exc.stuck_at})" if exc.stuck_at else "")
    at = raised_at(exc)
    return f"raised {type(exc).__name__}: {exc}" + (f" at {at}" if at else "")


def build_app(served: dict[str, Served], calls: Calls, *, api_key: str | None = None) -> Any:
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
                "timeout": calls.timeout}

    @app.post(SCORE_PATH)
    async def score(req: ScoreRequest) -> Any:
        if req.protocol != PROTOCOL_VERSION:
            return JSONResponse(status_code=422, content={"detail": f"protocol {req.protocol}; this server speaks "
                                                          f"{PROTOCOL_VERSION}: use grpo train of the same version"})
        if req.reward not in served:
            return JSONResponse(status_code=404, content={"detail": f"no reward {req.reward!r} here; served: "
                                                          f"{', '.join(served)}"})
        status, body = await asyncio.wrap_future(calls.submit(served[req.reward], req))
        # Python's JSON (NaN allowed: the client reads it as Python does), not starlette's strict one
        return Response(content=json.dumps(body), status_code=status, media_type="application/json")

    return app


def load_rewards(names: list[str]) -> dict[str, Served]:
    """The rewards named on the command line, resolved as [[rewards]] names are (UserError otherwise)."""
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
               timeout: float | None = None) -> None:
    """Serve ``names`` until SIGINT or SIGTERM (module docstring)."""
    import uvicorn

    sock = bound_socket(host, port)
    if host not in LOOPBACK:
        print(f"warning: grpo reward-serve listens on {host}, reachable from other machines"
              + ("" if api_key else " and without --api-key: anyone who can reach the port can call the rewards"),
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    served = load_rewards(names)
    if any(takes_state(s.fn) for s in served.values()):  # transformers (for their TrainerState) imports
        threading.Thread(target=rebuilt_state, args=(None,), name="grpo-import", daemon=True).start()  # meanwhile
    calls = Calls(timeout)
    server = uvicorn.Server(uvicorn.Config(build_app(served, calls, api_key=api_key), log_level="warning",
                                           timeout_graceful_shutdown=5))
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


__all__ = ["Calls", "Served", "build_app", "load_rewards", "run_server", "score_batch"]
