"""One thread that runs `grpo ref-serve`'s model jobs in order: deadlines, stuck detection, health.

`grpo ref-serve` (grpocli.reference.host) drives its model from one Worker, so no two calls ever run
inside the model at once. A request thread puts a Job on the worker's queue and waits for its answer
at most its timeout (``ask``). The worker thread takes every job that is waiting at once and hands
them to its host's ``schedule``, which decides what runs when: the reference host batches log-prob
requests and holds those that read the weights while an update mixes them in.

The schedule runs a job with ``run`` (its answer or exception goes to the job's future) or a
batch of jobs under ``busy``; either marks the worker busy with a deadline, and a job still
running past it makes the worker stuck until it ends. ``ask`` refuses at once (503, nothing
queued) while the worker is stuck, its thread has ended, or its host marked it ``dead``;
``health`` gives the reason, which /health reports.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpocli.serving.access import ServerError


@dataclass
class Job:
    """One request for the worker thread: what it is, its arguments, and the future of its answer."""

    kind: str
    args: tuple = ()
    future: Future = field(default_factory=Future)


_CLOSE = Job("close")  # put by close(): the thread ends when it takes it


class Worker:
    """A daemon thread that hands its host's ``schedule`` every job waiting, in the order they came.

    ``wait()`` is asked before each wait for jobs: the most seconds to wait before ``schedule`` is
    called with no jobs (None: until one comes). ``device``: the model's CUDA device, made the
    thread's current one before any job (None: the CPU, or the thread's default, GPU 0). The texts
    of ``health`` name the model (``subject``: "the engine"), the thread (``worker``) and the
    command to restart (``restart``).
    """

    def __init__(self, name: str, schedule: Callable[[list[Job]], None], *, subject: str, worker: str,
                 restart: str, wait: Callable[[], float | None] = lambda: None, device: Any = None) -> None:
        self.schedule, self.wait, self.device = schedule, wait, device
        self.subject, self.worker, self.restart = subject, worker, restart
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.dead: str | None = None  # why the worker can take no more jobs (set by the host, or a bug here)
        self._busy: tuple[str, float] | None = None  # (label, deadline) of what runs now
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    # -- request threads ------------------------------------------------------------------
    def ask(self, job: Job, timeout: float) -> Any:
        """The job's answer (or its exception), waited for at most ``timeout`` s; past that,
        concurrent.futures.TimeoutError, and the job stays queued or running (the caller may cancel
        it). A worker that takes no jobs is refused at once: 503 with ``health``'s reason."""
        self.put(job)
        return job.future.result(timeout=timeout)

    def put(self, job: Job) -> None:
        """Queue ``job``, or refuse at once (503 with ``health``'s reason) if the worker takes no jobs."""
        problem = self.health()
        if problem is not None:
            raise ServerError(503, problem)
        self.jobs.put(job)

    def submit(self, job: Job) -> Future:
        """Queue ``job`` and return its future at once (``health`` is not asked)."""
        self.jobs.put(job)
        return job.future

    def waiting(self) -> int:
        """Jobs queued that the worker thread has not taken yet."""
        return self.jobs.qsize()

    def health(self) -> str | None:
        """None when the worker takes jobs, else why not (dead, its thread ended, or stuck past a deadline)."""
        if self.dead or not self.thread.is_alive():
            return self.dead or f"{self.worker} thread has stopped; restart {self.restart}"
        busy = self._busy
        if busy is not None and time.monotonic() > busy[1]:
            return (f"{self.subject} is stuck: {busy[0]} has run {time.monotonic() - busy[1]:.0f} s past its "
                    f"deadline; restart {self.restart}")
        return None

    def close(self) -> None:
        """Take no more jobs: the queued ones are cancelled; a running one ends on its own (nobody waits)."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            job.future.cancel()
        self.jobs.put(_CLOSE)

    # -- the worker thread (called by ``schedule``) ------------------------------------------
    def run(self, job: Job, fn: Callable[..., Any], *args: Any, label: str, limit: float | None) -> None:
        """``fn(*args)`` as the job's answer (an exception too), unless the job was cancelled; it is
        ``label`` to ``health`` and counts as stuck once it has run ``limit`` s (None: never)."""
        if not job.future.set_running_or_notify_cancel():
            return
        with self.busy(label, limit):
            try:
                answer = fn(*args)
            except Exception as exc:  # noqa: BLE001 - the request's answer (4xx/5xx), not the worker's end
                job.future.set_exception(exc)
            else:
                job.future.set_result(answer)

    @contextmanager
    def busy(self, label: str, limit: float | None) -> Iterator[None]:
        """The worker is busy with ``label`` while the block runs; stuck once it has run ``limit`` s."""
        self._busy = None if limit is None else (label, time.monotonic() + limit)
        try:
            yield
        finally:
            self._busy = None

    def _serve(self) -> None:
        try:
            if self.device is not None:  # a new thread starts on GPU 0: take the model's GPU first
                from grpocli.generation.devices import use_device

                use_device(self.device)
            while True:
                jobs = self._take(self.wait())
                if jobs is None:
                    return
                self.schedule(jobs)
        except BaseException as exc:  # pragma: no cover - a bug; /health reports it
            self.dead = f"{self.worker} failed ({type(exc).__name__}: {exc}); restart {self.restart}"
            raise

    def _take(self, timeout: float | None) -> list[Job] | None:
        """Every job waiting once one has come ([] after ``timeout`` s without one); None once closed."""
        try:
            jobs = [self.jobs.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                jobs.append(self.jobs.get_nowait())
            except queue.Empty:
                break
        if any(job is _CLOSE for job in jobs):  # closed: what was queued with the close is cancelled too
            for job in jobs:
                job.future.cancel()
            return None
        return jobs


__all__ = ["Job", "Worker"]
