"""Asynchronous generation (generation.async_steps = k): the next k batches generate while this
one trains, as in open-instruct's grpo_fast and TRL's async mode.

Generation runs on one worker thread, which first makes the process's CUDA device and torch thread
count its own (a new thread starts on GPU 0, and with OpenMP's default thread count, not the one
train.torch_threads set: vLLM's CPU attention refuses to run with another count than the engine was
built with), so calls to the backend never overlap each other; the
loop calls `drain()` before it syncs weights, so a sync never overlaps a generation. A batch
generated with the weights of step s and trained at step t has staleness t - s <= k; the
engine's log-probs (from the weights that generated it) let the importance ratio account for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from grpocli.generation.base import Generated, GenerationBackend, Sampling
from grpocli.generation.devices import adopt_thread, process_device


@dataclass
class _Pending:
    rows: list[dict[str, Any]]
    future: Future
    step: int  # the optimizer step whose weights the backend holds when this batch was asked for


class Prefetcher:
    def __init__(self, backend: GenerationBackend, *, ahead: int, n: int, sampling: Sampling) -> None:
        self.backend, self.ahead, self.n, self.sampling = backend, ahead, n, sampling
        self.pending: deque[_Pending] = deque()
        parallel = getattr(backend, "parallel", None)
        self.device = process_device(parallel.device if parallel is not None else None)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-generate",
                                         initializer=adopt_thread, initargs=(self.device, _torch_threads()))
        self.lock = threading.Lock()
        self.started_at = time.perf_counter()
        self.busy = 0.0                    # seconds the worker spent generating, finished batches
        self.running_since: float | None = None

    def next(self, next_rows: Callable[[], list[dict[str, Any]]], step: int) -> tuple[list[dict], Generated, int]:
        """The oldest batch (waiting for it if needed); then keep `ahead` more on the way."""
        if not self.pending:
            self._submit(next_rows(), step)
        item = self.pending.popleft()
        generated = item.future.result()
        while len(self.pending) < self.ahead:
            self._submit(next_rows(), step)
        return item.rows, generated, item.step

    def drain(self) -> None:
        """Wait until no generation is running (call before syncing weights)."""
        for item in self.pending:
            item.future.exception()  # waits; errors surface in next()

    def close(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)

    def idle_seconds(self) -> float:
        """Seconds since the start that the worker had no batch to generate (`grpo bench`'s engine idle)."""
        with self.lock:
            now = time.perf_counter()
            running = now - self.running_since if self.running_since is not None else 0.0
            return now - self.started_at - self.busy - running

    def _submit(self, rows: list[dict[str, Any]], step: int) -> None:
        texts = [row["prompt_text"] for row in rows]  # rendered rows (grpocli.data.template)
        future = self.worker.submit(self._generate, texts)
        self.pending.append(_Pending(rows, future, step))

    def _generate(self, texts: list[str]) -> Generated:
        with self.lock:
            self.running_since = time.perf_counter()
        try:
            return self.backend.generate(texts, self.n, self.sampling)
        finally:
            with self.lock:
                self.busy += time.perf_counter() - self.running_since
                self.running_since = None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()

