"""A sync reward run in the main thread under grpo's timeout: for rewards that set a signal handler
or an alarm, which Python allows only in the main thread (math-verify's ``parse`` and ``verify``
with their default timeouts, written the open-r1 / TRL docs way).

grpo calls a sync reward with a timeout in a thread of its own (grpocli.rewards.invocation); one
that refuses to run there (``refuses_threads``) is called again in the main thread, as TRL calls
it, and from then on always there. The timeout still holds: a watchdog thread sends
``WATCHDOG_SIGNAL`` to the main thread when it passes (and again every ``REPEAT_S`` while the
call goes on), and the handler raises ``Deadline`` in the reward, a BaseException so that an
``except Exception`` in it (math-verify catches its own errors) does not swallow it. Unlike a call
left in a thread, a call stopped this way ends; one blocked in C code that never returns to
Python (a signal does not wake it) cannot be stopped, as with ``timeout = 0``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

#: A signal of grpo's own (math-verify uses SIGALRM; a real-time signal where the system has them).
WATCHDOG_SIGNAL: int = signal.SIGRTMIN + 1 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
REPEAT_S = 1.0  # how often the watchdog signals again while a reward that caught Deadline goes on


class Deadline(BaseException):
    """Raised in a reward running in the main thread when its timeout passes."""


def refuses_threads(exc: BaseException) -> bool:
    """Whether ``exc`` is Python (or math-verify) refusing a signal handler or alarm outside the
    main thread: 'signal only works in main thread of the main interpreter'."""
    text = str(exc).lower()
    return isinstance(exc, ValueError) and "signal" in text and "thread" in text


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def call_in_main_thread(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
    """``fn(**kwargs)`` in the calling thread, which must be the main one; raises Deadline (from
    inside the call) once ``timeout`` seconds pass, whatever else it raises goes through."""
    armed = [True]
    done = threading.Event()
    main = threading.main_thread().ident

    def on_signal(signum: int, frame: Any) -> None:
        if armed[0]:
            raise Deadline(f"no result within {timeout:g} s")

    def watch() -> None:
        wait = timeout
        while not done.wait(wait):
            signal.pthread_kill(main, WATCHDOG_SIGNAL)
            wait = REPEAT_S

    previous = signal.signal(WATCHDOG_SIGNAL, on_signal)
    watcher = threading.Thread(target=watch, name="grpo-reward-watchdog", daemon=True)
    try:
        watcher.start()
        return fn(**kwargs)
    finally:
        while True:  # a Deadline handled before the disarming is done must not cut it short
            try:
                armed[0] = False  # a signal handled from here on does nothing
                done.set()
                watcher.join()
                break
            except Deadline:
                continue
        signal.signal(WATCHDOG_SIGNAL, previous)
