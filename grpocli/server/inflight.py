"""A request's engine job in flight, and how it is called off.

A route queues its job on the engine thread (grpocli.server.host) and waits for the answer on the
event loop (``wait_for``), watching its client meanwhile. When the client disconnects, the
request's time is up, or the server shuts down, the job is cancelled: a job still queued never
runs, and one already running stops at the engine's next step, where the step guard
(``guard_steps``) raises ``Cancelled``; the host then aborts every request the job left inside
vLLM (vLLM's ``abort_request``, as vLLM's own server does for a client that goes away), so the
engine is free for the next job within one step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from grpocli.server.worker import Job
from grpocli.serving.access import ServerError

#: How often a waiting request looks whether its client is still there (s).
POLL = 0.2
#: The status of an answer nobody reads: the client closed its connection (nginx's 499).
CLIENT_GONE = 499


class Cancelled(Exception):
    """Raised inside the engine's step loop when the running job was called off."""


class Cancel:
    """Whether, and why, a job is called off: set from any thread, read on the engine thread."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._event = threading.Event()

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def guard_steps(llm_engine: Any, running: Callable[[], Cancel | None]) -> None:
    """Make vLLM's ``llm_engine.step`` (which LLM.generate calls until its requests finish) raise
    ``Cancelled`` first when ``running()`` (the Cancel of the job on the engine thread) is set."""
    step = llm_engine.step

    def step_unless_cancelled(*args: Any, **kwargs: Any) -> Any:
        cancel = running()
        if cancel is not None and cancel.is_set():
            raise Cancelled(cancel.reason or "the request was called off")
        return step(*args, **kwargs)

    llm_engine.step = step_unless_cancelled


async def wait_for(job: Job, cancel: Cancel, request: Any, timeout: float) -> Any:
    """The job's answer (or its exception); the job is called off when the client of ``request``
    (a Starlette Request) disconnects (answer 499), after ``timeout`` s (504), or when this wait
    is cancelled (the server shutting down: 503)."""
    answer = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(client_gone(request))
    try:
        done, _ = await asyncio.wait({answer, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stops: this request still gets an answer
        call_off(job, cancel, "the server is shutting down", answer)
        raise ServerError(503, "the server is shutting down; this request was aborted") from None
    finally:
        gone.cancel()
    if answer in done:
        return answer.result()
    if gone in done:
        call_off(job, cancel, "the client disconnected", answer)
        raise ServerError(CLIENT_GONE, "the client disconnected; its request was aborted")
    call_off(job, cancel, f"past the request timeout ({timeout:g} s)", answer)
    raise ServerError(504, f"the engine did not answer within {timeout:g} s; the request was aborted "
                           "(raise grpo vllm-serve --request-timeout for longer generations)")


def call_off(job: Job, cancel: Cancel, reason: str, answer: asyncio.Future | None = None) -> None:
    """A queued job never runs; a running one stops at the engine's next step (``answer``, the
    wait's own future of it, is dropped: nobody reads how the job ends)."""
    cancel.set(reason)
    job.future.cancel()
    if answer is not None:
        answer.cancel()


async def client_gone(request: Any) -> None:
    """Returns once the client of ``request`` has disconnected."""
    while not await request.is_disconnected():
        await asyncio.sleep(POLL)


__all__ = ["CLIENT_GONE", "Cancel", "Cancelled", "call_off", "client_gone", "guard_steps", "wait_for"]
