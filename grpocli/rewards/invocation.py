"""Calling reward functions: sync ones in turn, async ones together on one background loop.

As in TRL's GRPOTrainer, ``async def`` rewards run concurrently on a persistent event loop in
a daemon thread (so clients bound to a loop keep working between steps) while the sync ones
run in the calling thread. A timeout turns a call that does not return into an error: sync
calls then run in a daemon thread that is left behind when it expires.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Callable

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_loop_lock = threading.Lock()


@dataclass
class Failed:
    """The exception a call raised (or a TimeoutError), in place of its result."""

    exc: BaseException


def keyword_names(fn: Callable[..., Any]) -> set[str] | None:
    """Names ``fn`` takes as keywords; None when it takes ``**kwargs`` or has no signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have none
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def accepted_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """``kwargs`` the function can take: all with ``**kwargs``, else its named parameters plus ``keep``."""
    names = keyword_names(fn)
    if names is None:
        return kwargs
    return {k: v for k, v in kwargs.items() if k in names or k in keep}


def is_async(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions (also wrapped in functools.partial) and async __call__."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def call_all(calls: list[tuple[Callable[..., Any], dict[str, Any]]], timeout: float | None) -> list[Any]:
    """Results of ``fn(**kwargs)`` for each call, in order; a raised exception comes back as Failed."""
    results: list[Any] = [None] * len(calls)
    coroutines: dict[int, Awaitable[Any]] = {}
    for i, (fn, kwargs) in enumerate(calls):
        if is_async(fn):
            coroutines[i] = _start(fn, kwargs)
    pending = _submit(coroutines, timeout) if coroutines else None
    late: dict[int, Awaitable[Any]] = {}
    for i, (fn, kwargs) in enumerate(calls):
        if i in coroutines:
            continue
        results[i] = _call_sync(fn, kwargs, timeout)
        if inspect.isawaitable(results[i]):  # a sync callable that hands back a coroutine
            late[i] = results[i]
    futures = [f for f in (pending, _submit(late, timeout) if late else None) if f is not None]
    for future in futures:
        for i, value in future.result().items():
            results[i] = value
    return results


def call_one(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """One call, sync or async; the result, or Failed."""
    return call_all([(fn, kwargs)], timeout)[0]


def _start(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Awaitable[Any]:
    try:
        return fn(**kwargs)  # creates the coroutine; binding errors (TypeError) raise here
    except Exception as exc:
        return _raise_later(exc)


async def _raise_later(exc: BaseException) -> Any:
    raise exc


def _call_sync(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    if timeout is None:
        try:
            return fn(**kwargs)
        except Exception as exc:
            return Failed(exc)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(**kwargs)
        except Exception as exc:
            box["result"] = Failed(exc)

    thread = threading.Thread(target=target, name="grpo-reward", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return Failed(TimeoutError(_timeout_message(timeout)))
    return box["result"]


def _timeout_message(timeout: float) -> str:
    return f"no result within {timeout:g} s"


def _submit(coroutines: dict[int, Awaitable[Any]], timeout: float | None):
    async def one(aw: Awaitable[Any]) -> Any:
        try:
            return await (asyncio.wait_for(aw, timeout) if timeout is not None else aw)
        except asyncio.TimeoutError:
            return Failed(TimeoutError(_timeout_message(timeout or 0)))
        except Exception as exc:
            return Failed(exc)

    async def gather() -> dict[int, Any]:
        values = await asyncio.gather(*(one(aw) for aw in coroutines.values()))
        return dict(zip(coroutines, values))

    return asyncio.run_coroutine_threadsafe(gather(), _event_loop())


def _event_loop() -> asyncio.AbstractEventLoop:
    """The persistent loop async rewards run on, started on first use (again after a fork)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop.is_closed() or _loop_pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="grpo-async-rewards", daemon=True).start()
        return _loop
