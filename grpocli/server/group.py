"""The weight group that grpo's own client joins (POST /weights/group): a TCPStore on the
server's address and a gloo or NCCL group of two, the client rank 0 (it broadcasts the buckets).

At most one group exists: a setup the client has not joined yet is handed out again (a retrying
client must not open a port per call), and a finished or failed one is closed before a new one
opens. The store listens on the server's bind address only (torch's own listener would take
every address of the machine).
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from grpocli.generation.weights import open_group
from grpocli.serving.access import ServerError


class BroadcastGroup:
    """The group being set up or joined (``backend`` None: none is open)."""

    def __init__(self, bind_host: str) -> None:
        self.bind_host = bind_host
        self.group: Any = None
        self.backend: str | None = None
        self._ready: Future | None = None
        self._store: Any = None

    def open(self, backend: str, timeout: float) -> int:
        """The port of the store for the client to join as rank 0 (the caller holds the host's lock)."""
        if backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise ServerError(400, "transport 'nccl' needs a GPU on the server; use 'gloo' or 'http'")
        pending = self._ready
        if pending is not None and not pending.done() and self._store is not None:
            if self.backend != backend:
                raise ServerError(409, f"a {self.backend} group is being set up; join it, or wait for its timeout")
            return self._store.port
        self.close()
        store = self._listening_store(timeout)
        self._ready, self._store, self.backend = Future(), store, backend
        threading.Thread(target=self._join, args=(backend, store, timeout, self._ready),
                         name="grpo-weights-group", daemon=True).start()
        return store.port

    def _listening_store(self, timeout: float) -> Any:
        """A master TCPStore whose listening socket is bound to ``bind_host`` (passed by file descriptor)."""
        import socket
        from datetime import timedelta

        import torch.distributed as dist

        family = socket.AF_INET6 if ":" in self.bind_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((self.bind_host, 0))
            sock.listen(16)
            store = dist.TCPStore(self.bind_host, sock.getsockname()[1], 2, True, timedelta(seconds=timeout),
                                  wait_for_workers=False, master_listen_fd=sock.fileno())
        except Exception as exc:
            sock.close()
            raise ServerError(500, f"cannot open a weight group on {self.bind_host}: {exc}") from None
        sock.detach()  # the store owns the descriptor now and closes it with itself
        return store

    def _join(self, backend: str, store: Any, timeout: float, ready: Future) -> None:
        host = self.bind_host if self.bind_host not in ("0.0.0.0", "::") else None
        try:
            group = open_group(backend, store, 1, 2, timeout, hostname=host)
        except Exception as exc:  # reported by the next bucket
            ready.set_exception(exc)
            return
        if self._ready is ready:
            self.group = group
            ready.set_result(group)
        else:  # replaced meanwhile
            shutdown(group)
            ready.set_exception(RuntimeError("the group was replaced by a newer one"))

    def close(self) -> None:
        """Close the group and its store (their sockets close with them)."""
        group, self.group, self._store, self._ready, self.backend = self.group, None, None, None, None
        if group is not None:
            shutdown(group)

    def wait(self, timeout: float) -> Any:
        """The joined group, waiting at most ``timeout`` s for the client to join it."""
        if self._ready is None:
            raise ServerError(409, "no weight group is open; POST /weights/group first")
        try:
            return self._ready.result(timeout=timeout)
        except FutureTimeout:
            raise ServerError(504, f"the client did not join the {self.backend} group within {timeout:g} s") from None
        except Exception as exc:
            raise ServerError(502, f"the {self.backend} group failed: {exc}") from None


def shutdown(group: Any) -> None:
    """Close a process group's connections (a group torch cannot shut down is just dropped)."""
    with contextlib.suppress(Exception):  # best effort: the group is being thrown away
        group.shutdown()


__all__ = ["BroadcastGroup", "shutdown"]
