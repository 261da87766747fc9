"""How `grpo` ends: with its exit code, never held open by a thread it cannot stop.

A tool call, an environment step, a reward or a judge request that never returns is given up at
its timeout, but Python cannot stop the thread it runs in. Python's own exit waits for every
non-daemon thread and for every busy ``concurrent.futures`` worker (daemon or not:
``threading._register_atexit`` joins them), so one such thread kept the process alive after
training had finished or after SIGTERM (a judge whose server never answers: as long as the
client's timeout, hours). ``leave(code)`` gives those threads ``GRACE_S`` seconds to end; where
some still run, it names them and where each waits, runs the exit handlers (``atexit``: logging,
trackers, temporary files), flushes the output and ends the process with ``code`` without
waiting for them. Where none is left, the exit is Python's own.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import NoReturn

GRACE_S = 5.0  # how long threads still running at the end may take to finish


def leave(code: int | str | None, started_after: set[threading.Thread] | frozenset = frozenset()) -> NoReturn:
    """Exit with ``code`` (as ``sys.exit`` takes it), not waiting past ``GRACE_S`` for threads that
    hang; threads in ``started_after`` (alive when the command began: a caller's own) are not ours."""
    stuck = [t for t in blocking_threads() if t not in started_after]
    deadline = time.monotonic() + GRACE_S
    for thread in stuck:
        thread.join(max(deadline - time.monotonic(), 0.0))
    stuck = [t for t in stuck if t.is_alive() and t in blocking_threads()]
    if not stuck:
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else 0 if code is None else 1
    places = "; ".join(f"{t.name} at {waits_at(t) or 'an unknown place'}" for t in stuck[:4])
    print(f"warning: {len(stuck)} thread(s) still run code that never returned ({places}); grpo exits without "
          "waiting for them (a tool, environment, reward or judge request past its timeout: Python cannot stop "
          "a thread)", file=sys.stderr, flush=True)
    try:
        atexit._run_exitfuncs()  # what a normal exit runs, but threading's wait for every thread
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def blocking_threads() -> list[threading.Thread]:
    """The threads Python's exit would wait for: non-daemon ones, and busy concurrent.futures workers."""
    pool = sys.modules.get("concurrent.futures.thread")
    workers = set(getattr(pool, "_threads_queues", {})) if pool is not None else set()
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or not thread.is_alive():
            continue
        if thread in workers:
            top = frames.get(thread.ident)
            if top is not None and top.f_code.co_name == "_worker" and top.f_code.co_filename == pool.__file__:
                continue  # an idle worker: Python's exit tells it to stop and it does
            out.append(thread)
        elif not thread.daemon:
            out.append(thread)
    return out


def waits_at(thread: threading.Thread) -> str | None:
    """'file:line' where a thread waits, in the user's code where it can."""
    from grpocli.rewards.invocation import thread_at

    return thread_at(thread)


__all__ = ["GRACE_S", "blocking_threads", "leave"]
