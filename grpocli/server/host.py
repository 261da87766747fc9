"""The engine behind the server: one thread runs it; weight updates stream into it with timeouts.

Every engine call (generate, reload, cache reset) is a job of one Worker (grpocli.server.worker),
run on its thread in the order it came, so requests never race inside vLLM. A weight update is a
stream: ``begin`` queues one call of vLLM's ``reload_weights`` on that thread whose weight
iterator reads buckets from a small queue; ``bucket`` / ``broadcast`` put checked tensors on it;
``end`` closes it and waits. Memory stays at about two buckets. Every wait is bounded: a bucket
that does not come within the update's timeout fails the update with that reason, and a failed or
abandoned update leaves the engine marked as holding incomplete weights (generation is refused with
that reason) until a complete update succeeds.

No request can wedge the engine: when an engine call raises, every request still inside vLLM is
aborted on that same thread before the next call runs, so the error fails that request alone. If
that clean-up itself fails the engine is marked dead; a call still running past its deadline marks
it stuck. Both are refused with a 503 and reported by /health (see ``health``).
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from grpocli.generation.devices import gpu_identity, use_device
from grpocli.generation.weights import (
    Named,
    TensorSpec,
    broadcast,
    bucket_bytes,
    dtype_name,
    open_group,
    spec_problems,
    unflatten_bucket,
)
from grpocli.server.worker import Job, ServerError, Worker

_END, _ABORT = object(), object()


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
        self.received: set[str] = set()
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

    def put(self, named: list[Named]) -> None:
        self.check(named)
        self._put([*named, *((alias, t) for name, t in named for alias in self.repeats.get(name, ()))])
        self.received.update(name for name, _ in named)

    def _put(self, item: Any) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.future is not None and self.future.done():
                raise ServerError(409, f"the weight update already ended: {_reason(self.future)}")
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
            if item is _END:
                break
            if item is _ABORT:
                raise RuntimeError("the client aborted the update")
            yield from item
        missing = sorted(set(self.expected) - self.received) if self.complete else []
        if missing:
            raise ValueError(f"the update ended without {len(missing)} of the engine's tensors "
                             f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")


class EngineHost:
    """A VllmEngine driven from one thread; state of weight updates and the broadcast group."""

    def __init__(self, engine: Any, *, bind_host: str = "127.0.0.1") -> None:
        self.engine = engine
        self.bind_host = bind_host
        self.lock = threading.Lock()
        self.update: WeightUpdate | None = None
        self.version = 0
        self.broken: str | None = None
        self.group: Any = None
        self.group_backend: str | None = None
        self._group_ready: Future | None = None
        self._store: Any = None
        self.device = getattr(engine, "device", None)  # the engine's CUDA device; None: the CPU
        self.worker = Worker("grpo-engine", self._in_order, subject="the engine", worker="the engine worker",
                             restart="grpo vllm-serve", device=self.device)

    def info(self) -> dict[str, Any]:
        """/info: the engine's model, dtype and weights version, the weight transports, and its device
        ({"type": "cuda", "uuid": ...}: a trainer on the same GPU must not pick NCCL)."""
        import torch

        e = self.engine
        return {"model": e.model, "max_model_len": e.max_model_len, "world_size": e.world_size,
                "dtype": dtype_name(e.dtype), "weights_version": self.version,
                "transports": ["http", "gloo", *(["nccl"] if torch.cuda.is_available() else [])],
                "device": gpu_identity(self.device)}

    def run(self, fn: Any, *args: Any, timeout: float, **kwargs: Any) -> Any:
        """Run fn on the engine thread; bad input -> 400, a slow engine -> 504, a stuck or dead one -> 503."""
        job = Job(getattr(fn, "__name__", "an engine call"), (functools.partial(fn, *args, **kwargs), timeout))
        try:
            return self.worker.ask(job, timeout)
        except FutureTimeout:
            raise ServerError(504, f"the engine did not answer within {timeout:g} s") from None
        except Exception as exc:
            if is_bad_input(exc):
                raise ServerError(400, f"{type(exc).__name__}: {exc}") from None
            raise

    def _in_order(self, jobs: list[Job]) -> None:
        """The worker's schedule: each job as it came, under its own deadline (``run``'s timeout)."""
        for job in jobs:
            call, limit = job.args
            self.worker.run(job, self._guarded, call, label=job.kind, limit=limit)

    def _guarded(self, call: Any) -> Any:
        """call() on the engine thread; on any error the engine is cleaned up before the next call."""
        try:
            return call()
        except BaseException:
            self._recover()
            raise

    def _recover(self) -> None:
        """Abort every request still inside vLLM (a failed step leaves them there, and the next
        call would step them again, forever); mark the engine dead if even that fails."""
        try:
            engine = self.engine.llm.llm_engine
            pending = list(engine.output_processor.external_req_ids)
            if pending:
                engine.abort_request(pending, internal=False)
        except AttributeError:
            return  # not a vLLM engine (nothing is left inside it)
        except Exception as exc:
            self.worker.dead = (f"the engine failed and could not be cleaned up ({type(exc).__name__}: {exc}); "
                                "restart grpo vllm-serve")

    def health(self) -> str | None:
        """None when the engine can take calls, else why not (dead, closed, or stuck on a call past its deadline)."""
        return self.worker.health()

    def generate(self, prompts: list, n: int, sampling: Any, *, seed: int | None, logprobs: bool,
                 timeout: float) -> Any:
        with self.lock:
            self._refuse_while_updating()
        return self.run(self.engine.generate, prompts, n, sampling, logprobs=logprobs, seed=seed, timeout=timeout)

    def call(self, fn: Any, *args: Any, timeout: float, **kwargs: Any) -> Any:
        """fn(engine, *args, **kwargs) on the engine thread, refused while the weights change or are incomplete."""
        with self.lock:
            self._refuse_while_updating()
        return self.run(fn, self.engine, *args, timeout=timeout, **kwargs)

    def reset_prefix_cache(self, timeout: float) -> None:
        with self.lock:
            self._reap()
            if self.update is not None:
                raise ServerError(409, f"a weight update ({self.update.id}) is in progress; wait for it to end")
        self.run(self.engine.reset_prefix_cache, timeout=timeout)

    def _refuse_while_updating(self) -> None:
        self._reap()
        if self.update is not None:
            raise ServerError(409, f"a weight update ({self.update.id}) is in progress; wait for it to end")
        if self.broken:
            raise ServerError(409, self.broken)

    def _reap(self) -> None:
        """Forget an update whose engine side already failed (e.g. the client went away)."""
        u = self.update
        if u is not None and u.future is not None and u.future.done() and u.future.exception():
            self.broken = f"the weights are incomplete: update {u.id} failed ({_reason(u.future)}); " \
                          "send a complete weight update or restart the server"
            self.update = None

    # -- weight updates ------------------------------------------------------------------
    def begin(self, spec: list[TensorSpec] | None, aliases: dict[str, str], timeout: float,
              transport: str, *, complete: bool = True) -> WeightUpdate:
        """Start an update; ``transport`` is "http", "gloo" or "nccl" (grpo's group) or "trl" (TRL's group,
        see transfer.py); ``complete``: the update must hold every tensor of the engine's checkpoint."""
        expected = self.engine.spec
        with self.lock:
            self._reap()
            if self.update is not None:
                raise ServerError(409, f"another weight update ({self.update.id}) is in progress")
            if transport in ("gloo", "nccl") and self.group_backend != transport:
                raise ServerError(409, f"no {transport} group is open; POST /weights/group first")
            bad = [f"{a} -> {t}" for a, t in aliases.items() if expected and t not in expected]
            problems = spec_problems(expected, spec) if spec is not None and expected else []
            if bad or problems:
                raise ServerError(409, "the weights do not fit the engine's model: "
                                  + "; ".join([*(f"alias of an unknown tensor: {b}" for b in bad), *problems]))
            u = WeightUpdate(expected, aliases, timeout, transport, complete=complete)
            load = functools.partial(self.engine.load_weights, u.tensors())
            u.future = self.worker.submit(Job("load_weights", (load, None)))  # no deadline: its waits are bounded
            self.update = u
            return u

    def current(self, update_id: str) -> WeightUpdate:
        with self.lock:
            self._reap()
            u = self.update
        if u is None or u.id != update_id:
            raise ServerError(409, f"no weight update {update_id!r} is in progress"
                              + (f" ({self.broken})" if self.broken else ""))
        return u

    def receive_broadcast(self, update_id: str, specs: list[TensorSpec]) -> int:
        """Take one bucket from the process group (root: the client) and queue it."""
        import torch

        u = self.current(update_id)
        group = self._wait_group(u.timeout)
        device = (self.device or "cuda") if self.group_backend == "nccl" else "cpu"
        use_device(self.device)  # a request thread: the engine's GPU is its current one too
        flat = torch.empty(bucket_bytes(specs), dtype=torch.uint8, device=device)
        try:
            broadcast(group, flat, u.timeout, root=0)
        except Exception as exc:
            raise ServerError(504, f"the bucket did not arrive over {self.group_backend}: {exc}") from None
        u.put(unflatten_bucket(flat, specs))
        return len(specs)

    def end(self, update_id: str, *, abort: bool = False) -> dict[str, Any]:
        """Close the update's stream and wait for the engine; abort leaves the weights incomplete."""
        u = self.current(update_id)
        try:
            u._put(_ABORT if abort else _END)
            count = u.future.result(timeout=u.timeout)
        except FutureTimeout:
            self.broken = f"the weights are incomplete: update {u.id} did not finish within {u.timeout:g} s"
            raise ServerError(504, self.broken) from None
        except ServerError:
            raise
        except Exception as exc:
            self.broken = (f"the weights are incomplete: update {u.id} failed ({type(exc).__name__}: {exc}); "
                           "send a complete weight update or restart the server")
            if abort:
                return {"aborted": True, "detail": self.broken}
            raise ServerError(409, self.broken) from None
        finally:
            with self.lock:
                if self.update is u:
                    self.update = None
        self.version += 1
        if not u.expected or set(u.expected) <= u.received:  # a partial (TRL) update does not repair
            self.broken = None
        return {"weights_version": self.version, "tensors": count, "seconds": time.perf_counter() - u.started}

    # -- the broadcast group ------------------------------------------------------------
    def open_group(self, backend: str, timeout: float) -> int:
        """The port of a TCPStore on the server's own address for the client to join as rank 0.

        At most one group exists: a setup the client has not joined yet is handed out again (a
        retrying client must not open a port per call), and a finished or failed one is closed
        before a new one opens. The store listens on ``bind_host`` only (torch's own listener would
        take every address of the machine).
        """
        if backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise ServerError(400, "transport 'nccl' needs a GPU on the server; use 'gloo' or 'http'")
        with self.lock:
            self._reap()
            if self.update is not None and self.update.transport in ("gloo", "nccl"):
                raise ServerError(409, f"a weight update ({self.update.id}) is using the {self.update.transport} "
                                       "group; wait for it to end")
            pending = self._group_ready
            if pending is not None and not pending.done() and self._store is not None:
                if self.group_backend != backend:
                    raise ServerError(409, f"a {self.group_backend} group is being set up; join it, or wait "
                                           "for its timeout")
                return self._store.port
            self.close_group()
            store = self._listening_store(timeout)
            self._group_ready, self._store, self.group_backend = Future(), store, backend
            threading.Thread(target=self._join_group, args=(backend, store, timeout, self._group_ready),
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

    def _join_group(self, backend: str, store: Any, timeout: float, ready: Future) -> None:
        host = self.bind_host if self.bind_host not in ("0.0.0.0", "::") else None
        try:
            group = open_group(backend, store, 1, 2, timeout, hostname=host)
        except Exception as exc:  # reported by the next bucket
            ready.set_exception(exc)
            return
        if self._group_ready is ready:
            self.group = group
            ready.set_result(group)
        else:  # replaced meanwhile
            _shutdown(group)
            ready.set_exception(RuntimeError("the group was replaced by a newer one"))

    def close_group(self) -> None:
        """Close the group and its store (their sockets close with them)."""
        group, self.group, self._store, self._group_ready, self.group_backend = self.group, None, None, None, None
        if group is not None:
            _shutdown(group)

    def _wait_group(self, timeout: float) -> Any:
        if self._group_ready is None:
            raise ServerError(409, "no weight group is open; POST /weights/group first")
        try:
            return self._group_ready.result(timeout=timeout)
        except FutureTimeout:
            raise ServerError(504, f"the client did not join the {self.group_backend} group "
                                   f"within {timeout:g} s") from None
        except Exception as exc:
            raise ServerError(502, f"the {self.group_backend} group failed: {exc}") from None

    def close(self) -> None:
        self.close_group()
        self.worker.close()
        self.engine.close()


def is_bad_input(exc: Exception) -> bool:
    """Errors that mean the request was wrong (vLLM's VLLMClientError family, ValueError, ...)."""
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return True
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return False
    return isinstance(exc, VLLMClientError)


def _shutdown(group: Any) -> None:
    """Close a process group's connections (a group torch cannot shut down is just dropped)."""
    with contextlib.suppress(Exception):  # best effort: the group is being thrown away
        group.shutdown()


def _reason(future: Future) -> str:
    exc = future.exception()
    return f"{type(exc).__name__}: {exc}" if exc else "finished"


__all__ = ["EngineHost", "ServerError", "WeightUpdate", "is_bad_input"]
