"""Calling reward functions: sync ones in turn, async ones together on one background loop.

As in TRL's GRPOTrainer, ``async def`` rewards run concurrently on a persistent event loop in
a daemon thread (so clients bound to a loop keep working between steps) while the sync ones
run in the calling thread. A timeout turns a call that does not return into an error: sync
calls then run in a daemon thread that is left behind when it expires (Python cannot stop a
thread; being a daemon, it does not keep the process alive), and a loop that an ``async def``
reward blocks (time.sleep instead of await) is left behind the same way for a fresh one.

Whatever a reward raises comes back as Failed, SystemExit (``sys.exit()`` in a reward) too, so
the caller decides (stop naming the reward, or score None); only KeyboardInterrupt goes through.
``os._exit(code)`` would end the process without a word, so while rewards run it raises
ProcessExit in this process instead (a process forked meanwhile, e.g. by multiprocessing, still
exits for real); what no Python code can stop (a signal, a crash in C) is left to the launcher's
report (grpocli.launch.processes), which names the reward through ``before``.
A function marked ``bounds_own_time = True`` (math-verify's signal alarms need the main
thread) always runs in the calling thread. A sync reward that refuses to run in a thread of its
own (it sets a signal handler or alarm: math-verify's ``parse``/``verify`` written the usual way)
is called again in the main thread, and always there from then on, its timeout enforced by a
watchdog that stops the call (grpocli.rewards.watchdog).

A call that timed out may go on in its thread; ``RewardTimeout.still_running`` counts the calls
of that function left running so, for the caller to warn and to stop before they eat the run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from grpocli.rewards import watchdog
from grpocli.rewards.watchdog import Deadline, call_in_main_thread, in_main_thread, refuses_threads

LOOP_GRACE_S = 5.0  # how long past the longest timeout to wait for a loop that should have answered

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_loop_thread: threading.Thread | None = None
_loop_lock = threading.Lock()

_left_behind: list[tuple[Callable[..., Any], threading.Thread]] = []  # calls that timed out, by function
_real_exit = os._exit
_exit_guards = 0  # call_all calls under way (os._exit is replaced while > 0)
_exit_owner = os.getpid()
_exit_lock = threading.Lock()
_main_thread_only: set[int] = set()  # id() of the sync rewards that refused to run in a thread


@dataclass
class Failed:
    """The exception a call raised (or a RewardTimeout), in place of its result."""

    exc: BaseException


class RewardTimeout(TimeoutError):
    """A call that gave no result within its timeout; ``stuck_at`` is 'file:line' where it was
    waiting, ``blocked_loop`` says the event loop of the async rewards stopped answering (a
    reward blocked it), so calling again would block again; ``still_running`` is how many calls
    of the function that timed out (this one included) still run in threads left behind;
    ``stopped`` says the call was stopped (it ran in the main thread): nothing goes on."""

    def __init__(self, seconds: float, stuck_at: str | None = None, blocked_loop: bool = False,
                 still_running: int = 0, stopped: bool = False) -> None:
        self.seconds, self.stuck_at, self.blocked_loop = seconds, stuck_at, blocked_loop
        self.still_running, self.stopped = still_running, stopped
        super().__init__(f"no result within {seconds:g} s")


class ProcessExit(BaseException):
    """``os._exit(code)`` called in a reward (or a tool), stopped before it ended the process."""

    def __init__(self, code: Any) -> None:
        self.code = code
        super().__init__(f"os._exit({code!r})")


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
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def call_all(calls: list[tuple[Callable[..., Any], dict[str, Any]]], timeouts: list[float | None],
             before: Callable[[list[int]], None] | None = None, seconds: list[float] | None = None) -> list[Any]:
    """Results of ``fn(**kwargs)`` for each call, in order, each bounded by its timeout in
    seconds (None: no bound); a raised exception, ``os._exit()`` or a timeout comes back as
    Failed. ``before(indices)`` is told which calls start next: the async ones (together), then
    each sync one. ``seconds``, where given, is filled with each call's wall seconds (an async
    one's from the start of the async calls to its own result; a sync one's, its own call)."""
    results: list[Any] = [None] * len(calls)
    took = [0.0] * len(calls)
    coroutines: dict[int, Awaitable[Any]] = {}
    announce = before or (lambda indices: None)
    with exits_caught():
        for i, (fn, kwargs) in enumerate(calls):
            if is_async(fn):
                coroutines[i] = _start(fn, kwargs)
        if coroutines:
            announce(list(coroutines))
        pending = _submit(coroutines, timeouts, calls, took) if coroutines else None
        late: dict[int, Awaitable[Any]] = {}
        for i, (fn, kwargs) in enumerate(calls):
            if i in coroutines:
                continue
            announce([i])
            t0 = time.perf_counter()
            results[i] = _call_sync(fn, kwargs, None if runs_inline(fn) else timeouts[i])
            took[i] = time.perf_counter() - t0
            if inspect.isawaitable(results[i]):  # a sync callable that hands back a coroutine
                late[i] = results[i]
        for batch in (pending, _submit(late, timeouts, calls, took) if late else None):
            for i, value in (batch.wait() if batch is not None else {}).items():
                results[i] = value
    if seconds is not None:
        seconds[:] = took
    return results


def call_one(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """One call, sync or async; the result, or Failed."""
    return call_all([(fn, kwargs)], [timeout])[0]


def still_running(fn: Callable[..., Any]) -> int:
    """How many calls of ``fn`` that timed out still run in the threads they were left in."""
    _left_behind[:] = [(f, t) for f, t in _left_behind if t.is_alive()]
    return sum(1 for f, _ in _left_behind if f is fn)


@contextlib.contextmanager
def exits_caught() -> Iterator[None]:
    """``os._exit`` raises ProcessExit in this process for the block (in any of its threads; a
    process forked meanwhile exits for real): rewards here, tools in grpocli.multiturn.execution."""
    global _exit_guards, _exit_owner
    with _exit_lock:
        if _exit_guards == 0:
            _exit_owner, os._exit = os.getpid(), _exit_from_reward
        _exit_guards += 1
    try:
        yield
    finally:
        with _exit_lock:
            _exit_guards -= 1
            if _exit_guards == 0:
                os._exit = _real_exit


def _exit_from_reward(code: int) -> None:
    if os.getpid() != _exit_owner:  # a child forked by the reward (multiprocessing) ends as it asks
        _real_exit(code)
    raise ProcessExit(code)


def runs_inline(fn: Callable[..., Any]) -> bool:
    """True for a function that bounds its own time and must run in the calling thread."""
    return bool(getattr(fn, "bounds_own_time", False))


def _start(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Awaitable[Any]:
    try:
        return fn(**kwargs)  # creates the coroutine; binding errors (TypeError) raise here
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit too
        return _raise_later(exc)


async def _raise_later(exc: BaseException) -> Any:
    raise exc


def _call_sync(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    if timeout is None:
        try:
            return fn(**kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a reward must not end the run unnamed
            return Failed(exc)
    if id(fn) in _main_thread_only and in_main_thread():
        return _call_main(fn, kwargs, timeout)
    result = _call_in_thread(fn, kwargs, timeout)
    if isinstance(result, Failed) and refuses_threads(result.exc) and in_main_thread():
        _main_thread_only.add(id(fn))  # as TRL calls it: in the main thread, where signals work
        return _call_main(fn, kwargs, timeout)
    return result


def _call_main(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
    """A call in the main thread that the watchdog stops at ``timeout``; the result, or Failed."""
    try:
        return call_in_main_thread(fn, kwargs, timeout)
    except KeyboardInterrupt:
        raise
    except Deadline as exc:
        spots = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)]
        return Failed(RewardTimeout(timeout, place([s for s in spots if s[0] != watchdog.__file__]), stopped=True))
    except BaseException as exc:  # noqa: BLE001 - SystemExit too
        return Failed(exc)


def _call_in_thread(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too
            box["result"] = Failed(exc)

    thread = threading.Thread(target=target, name="grpo-reward", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _left_behind.append((fn, thread))
        return Failed(RewardTimeout(timeout, thread_at(thread), still_running=still_running(fn)))
    return box["result"]


@dataclass
class _Batch:
    """Coroutines running on the shared loop, and how long to wait for all of them."""

    future: Any
    fns: dict[int, Callable[..., Any]]  # by index in the calls
    timeout: float  # the longest of their timeouts
    wait_s: float | None

    def wait(self) -> dict[int, Any]:
        try:
            return self.future.result(self.wait_s)
        except concurrent.futures.TimeoutError:
            thread = _loop_thread
            stuck_at = thread_at(thread) if thread is not None else None
            _abandon_loop()
            if thread is not None:  # left behind with whichever of them blocks it
                _left_behind.extend((fn, thread) for fn in self.fns.values())
            return {i: Failed(RewardTimeout(self.timeout, stuck_at, blocked_loop=True, still_running=still_running(fn)))
                    for i, fn in self.fns.items()}


def _submit(coroutines: dict[int, Awaitable[Any]], timeouts: list[float | None],
            calls: list[tuple[Callable[..., Any], dict[str, Any]]], took: list[float]) -> _Batch:
    """The coroutines on the shared loop; each one's seconds land in ``took`` (its timeout's when the
    loop stops answering)."""
    start = time.perf_counter()
    for i in coroutines:
        took[i] = timeouts[i] or 0.0  # stays so only if the loop never answers

    async def one(i: int, aw: Awaitable[Any], timeout: float | None) -> Any:
        task = asyncio.ensure_future(_guarded(aw))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        took[i] = time.perf_counter() - start
        if done:
            try:
                return task.result()
            except asyncio.CancelledError as exc:  # the reward cancelled itself
                return Failed(exc)
        stuck_at = _coroutine_at(aw)
        task.cancel()
        return Failed(RewardTimeout(timeout or 0, stuck_at))

    async def gather() -> dict[int, Any]:
        values = await asyncio.gather(*(one(i, aw, timeouts[i]) for i, aw in coroutines.items()))
        return dict(zip(coroutines, values))

    bounds = [timeouts[i] for i in coroutines]
    longest = max((t for t in bounds if t is not None), default=0.0)
    wait_s = None if any(t is None for t in bounds) else longest + LOOP_GRACE_S
    future = asyncio.run_coroutine_threadsafe(gather(), _event_loop())
    return _Batch(future, {i: calls[i][0] for i in coroutines}, longest, wait_s)


async def _guarded(aw: Awaitable[Any]) -> Any:
    """The awaitable's result, or Failed for whatever it raised: SystemExit raised in a task
    would otherwise stop the loop's thread and leave every caller waiting."""
    try:
        return await aw
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit too
        return Failed(exc)


def _event_loop() -> asyncio.AbstractEventLoop:
    """The persistent loop async rewards run on, started on first use (again after a fork)."""
    global _loop, _loop_pid, _loop_thread
    with _loop_lock:
        if _loop is None or _loop.is_closed() or _loop_pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            _loop_thread = threading.Thread(target=_loop.run_forever, name="grpo-async-rewards", daemon=True)
            _loop_thread.start()
        return _loop


def _abandon_loop() -> None:
    """Forget a loop a reward blocks; the next async call starts a fresh one."""
    global _loop, _loop_thread
    with _loop_lock:
        _loop, _loop_thread = None, None


def thread_at(thread: threading.Thread) -> str | None:
    """'file:line' where a running thread waits (see place); also for tools, environments and the exit."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    spots = []
    while frame is not None:
        spots.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return place(spots[::-1])


def _coroutine_at(coro: Any) -> str | None:
    """'file:line' where a suspended coroutine waits, through what it awaits (see place)."""
    spots = []
    while getattr(coro, "cr_frame", None) is not None:
        spots.append((coro.cr_frame.f_code.co_filename, coro.cr_frame.f_lineno))
        coro = coro.cr_await
    return place(spots)


def raised_at(exc: BaseException) -> str | None:
    """'file:line' where ``exc`` was raised, in the reward's own code where it can (see place)."""
    return place([(f.filename, f.lineno or 0) for f in traceback.extract_tb(exc.__traceback__)])


def place(spots: list[tuple[str, int]]) -> str | None:
    """'file:line' of the innermost of ``spots`` (file, line; outermost first) in the user's own
    code: outside the standard library and installed packages if any is, else outside the
    standard library (a plugin's reward), else the innermost; never this module."""
    paths = sysconfig.get_paths()
    stdlib, installed = (paths["stdlib"],), (paths["purelib"], paths["platlib"])
    spots = [(f, n) for f, n in spots if f != __file__]
    for outside in (stdlib + installed, stdlib, ()):
        own = [(f, n) for f, n in spots if not outside or not f.startswith(outside)]
        if own:
            return f"{own[-1][0]}:{own[-1][1]}"
    return None
