"""One weight update in flight: checked buckets on a small queue that the engine thread's
``reload_weights`` consumes (grpocli.server.host starts it, ends it and keeps its outcome).

A tensor reaches the engine at most once per update: vLLM's layerwise reload finishes a layer
when its last tensor arrives, and one that comes again after that fails the whole reload
(``AttributeError: 'Parameter' object has no attribute 'weight_loader'``) and leaves the engine
unable to take any later update. A bucket naming a tensor the update already took (a client that
retried a bucket it thought lost) is therefore refused whole with a 409 naming the tensors,
before anything of it is queued, and the update goes on as if the retry had not come.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from grpocli.generation.weights import Named, TensorSpec, spec_problems
from grpocli.serving.access import ServerError

END, ABORT = object(), object()  # what end() and abort put on the queue after the last bucket


class WeightUpdate:
    """One update in flight: checked buckets on a bounded queue, consumed by the engine thread."""

    def __init__(self, expected: dict[str, TensorSpec], aliases: dict[str, str], timeout: float,
                 transport: str, *, complete: bool = True) -> None:
        self.id = uuid.uuid4().hex
        self.expected, self.aliases, self.timeout, self.transport = expected, aliases, timeout, transport
        self.complete = complete  # must every tensor come? (TRL's updates may carry whole layers only)
        self.repeats: dict[str, list[str]] = {}  # name -> its aliases (tied weights travel once)
        for alias, name in aliases.items():
            self.repeats.setdefault(name, []).append(alias)
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.received: set[str] = set()  # names the client sent (checked against ``expected`` at the end)
        self.loaded: set[str] = set()  # names queued for the engine: those sent and their aliases
        self._names = threading.Lock()
        self.started = time.perf_counter()
        self.future: Future | None = None

    def check(self, named: list[Named]) -> None:
        """Names, shapes and dtypes of a bucket against the engine's checkpoint (400 if wrong)."""
        if not self.expected:
            return
        got = [TensorSpec.of(name, t) for name, t in named]
        problems = spec_problems(self.expected, got, complete=False)
        if problems:
            raise ServerError(400, "the bucket does not fit the engine's model: " + "; ".join(problems))

    def repeated(self, names: Iterable[str]) -> list[str]:
        """The names (or their aliases) this update already took, or that ``names`` lists twice."""
        names = list(names)
        with self._names:
            return self._repeated(names)

    def _repeated(self, names: list[str]) -> list[str]:
        seen: set[str] = set()
        twice: list[str] = []
        for name in self._with_aliases(names):
            if name in self.loaded or name in seen:
                twice.append(name)
            seen.add(name)
        return sorted(set(twice))

    def put(self, named: list[Named]) -> None:
        """Queue a checked bucket for the engine (409 and nothing queued if a tensor came before)."""
        self.check(named)
        names = [name for name, _ in named]
        with self._names:  # reserve the names at once: two copies of one bucket may arrive together
            twice = self._repeated(names)
            if twice:
                raise ServerError(409, repeat_reason(self.id, twice))
            self.received.update(names)
            self.loaded.update(self._with_aliases(names))
        try:
            self.put_item([*named, *((alias, t) for name, t in named for alias in self.repeats.get(name, ()))])
        except ServerError:  # not queued: a retry of this bucket must be taken
            with self._names:
                self.received.difference_update(names)
                self.loaded.difference_update(self._with_aliases(names))
            raise

    def put_item(self, item: Any) -> None:
        """A bucket, END or ABORT onto the queue, waiting for room at most the update's timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self.future is not None and self.future.done():
                raise ServerError(409, f"the weight update already ended: {reason(self.future)}")
            try:
                self.queue.put(item, timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
                return
            except queue.Full:
                if time.monotonic() > deadline:
                    raise ServerError(504, f"the engine took no bucket within {self.timeout:g} s") from None

    def tensors(self) -> Iterator[Named]:
        """The weight iterator vLLM's reload_weights consumes (on the engine thread)."""
        while True:
            try:
                item = self.queue.get(timeout=self.timeout)
            except queue.Empty:
                raise TimeoutError(f"no bucket arrived within {self.timeout:g} s (the client stopped?)") from None
            if item is END:
                break
            if item is ABORT:
                raise RuntimeError("the client aborted the update")
            yield from item
        missing = self.missing()
        if missing:
            raise ValueError(f"the update ended without {len(missing)} of the engine's tensors "
                             f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")

    def missing(self) -> list[str]:
        """The engine's tensors a complete update has not sent (none for a partial one)."""
        return sorted(set(self.expected) - self.received) if self.complete else []

    def whole(self) -> bool:
        """Does the update hold every tensor of the engine's checkpoint (so the weights are one version)?"""
        return not self.expected or set(self.expected) <= self.received

    def _with_aliases(self, names: list[str]) -> list[str]:
        return [*names, *(alias for name in names for alias in self.repeats.get(name, ()))]


def repeat_reason(update_id: str, names: list[str]) -> str:
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    return (f"weight update {update_id} already took {shown}: a tensor is loaded once per update (a retried "
            "bucket?); nothing of this bucket was loaded and the update goes on: send what was not acknowledged "
            "yet, then end the update")


def reason(future: Future) -> str:
    """How a finished job's future ended: its exception as 'Type: message', or 'finished'."""
    exc = future.exception()
    return f"{type(exc).__name__}: {exc}" if exc else "finished"


__all__ = ["ABORT", "END", "WeightUpdate", "reason", "repeat_reason"]
