"""InflightBackend (grpocli.generation.inflight) on stock vLLM servers: generation.backend = "vllm-server"
with generation.pipeline = "inflight".

Each group is one request to a server's token-in/token-out route (POST /inference/v1/generate, on a
thread of a pool: it returns when its G completions have ended), the groups dealt over the fleet's
servers in turn. A weight sync is vLLM's own: POST /pause?mode=keep on every server (requests in flight
are frozen between two engine steps, their KV cache kept), the weights through the weight-transfer
engine, labelled with the trainer's policy version (/finish_weight_update), POST /resume. vLLM reports
which weight version sampled each token (``weight_versions`` spans), so every token carries its
version and the engine's log-prob, as on the colocated engine.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpocli.generation.base import Sampling
from grpocli.generation.inflight import FinishedGroup, GroupRequest
from grpocli.generation.server_client import ServerClient


class ServerInflight:
    """The five calls of InflightBackend over stock vLLM servers. ``send(model)``: the backend's weight sync
    to every server; ``version``: the policy version the servers hold now; ``kv_cache``:
    generation.inflight_kv_cache ("recompute": the requests kept recompute their KV cache after a sync)."""

    def __init__(self, clients: Sequence[ServerClient], *, send: Callable[[Any], None], version: int,
                 kv_cache: str = "keep", workers: int = 256) -> None:
        self.clients, self.send, self.version = list(clients), send, version
        for client in self.clients:
            client.recompute = kv_cache == "recompute"
            client.label_weights(version)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="grpo-inflight-request")
        self.done: queue.Queue[FinishedGroup | BaseException] = queue.Queue()
        self.lock = threading.Lock()
        self.running = 0
        self.idle, self.idle_since = 0.0, time.monotonic()
        self.turn = 0

    def submit(self, groups: Sequence[GroupRequest], sampling: Sampling) -> None:
        for group in groups:
            client = self.clients[self.turn % len(self.clients)]
            self.turn += 1
            with self.lock:
                if self.running == 0:
                    self.idle += time.monotonic() - self.idle_since
                self.running += 1
            self.pool.submit(self._run, client, group, sampling)

    def _run(self, client: ServerClient, group: GroupRequest, sampling: Sampling) -> None:
        try:
            self.done.put(client.generate_group(group, sampling, default_version=self.version))
        except BaseException as exc:  # handed to the trainer by finished()
            self.done.put(exc)
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    self.idle_since = time.monotonic()

    def finished(self, timeout: float | None) -> list[FinishedGroup]:
        out: list[FinishedGroup | BaseException] = []
        try:
            out.append(self.done.get(timeout=timeout))
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                break
        for item in out:
            if isinstance(item, BaseException):
                raise item
        return out  # type: ignore[return-value]

    def sync_weights(self, model: Any, version: int) -> None:
        """Pause every server with its requests kept, send the weights labelled ``version``, resume."""
        for client in self.clients:
            client.pause("keep")
        try:
            for client in self.clients:
                client.label = version
            self.send(model)
            self.version = version
        finally:
            for client in self.clients:
                client.resume()

    def idle_seconds(self) -> float:
        with self.lock:
            return self.idle + (time.monotonic() - self.idle_since if self.running == 0 else 0.0)

    def close(self) -> None:
        for client in self.clients:
            client.abort_all()
        self.pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ServerInflight"]
