"""The engine behind the server: one thread runs it; weight updates stream into it with timeouts.

Every engine call (generate, reload, cache reset) is a job of one Worker (grpocli.server.worker),
run on its thread in the order it came, so requests never race inside vLLM. A weight update is a
stream (grpocli.server.update): ``begin`` queues one call of vLLM's ``reload_weights`` on that
thread whose weight iterator reads buckets from a small queue; ``bucket`` / ``broadcast`` put
checked tensors on it; ``end`` closes it and waits. Memory stays at about two buckets. Every wait
is bounded: a bucket that does not come within the update's timeout fails the update with that
reason, and a failed or abandoned update leaves the engine marked as holding incomplete weights
until a complete update succeeds.

Generation only ever sees a complete, announced version of the weights: it is refused (409)
while an update is in flight or the weights are incomplete, both when it is queued and again on
the engine thread when it runs (where the reload ran too), and it answers with the version it
was computed from. The version moves, and the incomplete mark is set or cleared, on the engine
thread as each reload ends.

No request can wedge the engine: a request's job is called off when its client disconnects or
its time is up (grpocli.server.inflight: at the engine's next step), and when an engine call
raises, every request still inside vLLM is aborted on that same thread before the next call
runs, so the error fails that request alone. If that clean-up itself fails the engine is marked
dead; a call still running past its deadline marks it stuck. Both are refused with a 503 and
reported by /health (see ``health``).
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from grpocli.generation.devices import gpu_identity, use_device
from grpocli.generation.weights import TensorSpec, broadcast, bucket_bytes, dtype_name, spec_problems, unflatten_bucket
from grpocli.server.group import BroadcastGroup
from grpocli.server.inflight import Cancel, Cancelled, call_off, guard_steps, wait_for
from grpocli.server.update import ABORT, END, WeightUpdate, reason
from grpocli.server.worker import Job, Worker
from grpocli.serving.access import ServerError


class EngineHost:
    """A VllmEngine driven from one thread; state of weight updates and the broadcast group."""

    def __init__(self, engine: Any, *, bind_host: str = "127.0.0.1") -> None:
        self.engine = engine
        self.bind_host = bind_host
        self.lock = threading.Lock()
        self.update: WeightUpdate | None = None
        self.version = 0  # moved on the engine thread, as each reload ends
        self.broken: str | None = None  # why the weights are incomplete (None: they are one version)
        self.group = BroadcastGroup(bind_host)
        self.device = getattr(engine, "device", None)  # the engine's CUDA device; None: the CPU
        self._running: Cancel | None = None  # the Cancel of the job on the engine thread
        self._prompt_chars: int | None = None
        llm_engine = getattr(getattr(engine, "llm", None), "llm_engine", None)
        if llm_engine is not None:
            guard_steps(llm_engine, lambda: self._running)
        self.worker = Worker("grpo-engine", self._in_order, subject="the engine", worker="the engine worker",
                             restart="grpo vllm-serve", device=self.device)

    def info(self) -> dict[str, Any]:
        """/info: the engine's model, dtype and weights version, the weight transports, and its device
        ({"type": "cuda", "uuid": ...}: a trainer on the same GPU must not pick NCCL)."""
        import torch

        e = self.engine
        return {"model": e.model, "max_model_len": e.max_model_len, "world_size": e.world_size,
                "dtype": dtype_name(e.dtype), "weights_version": self.version,
                "prefix_caching": getattr(e, "prefix_caching", None), "kv_cache_dtype": getattr(e, "kv_cache_dtype", None),
                "transports": ["http", "gloo", *(["nccl"] if torch.cuda.is_available() else [])],
                "device": gpu_identity(self.device)}

    def prompt_chars(self) -> int:
        """The most characters a prompt text may have (text_limit), worked out once."""
        if self._prompt_chars is None:
            self._prompt_chars = text_limit(self.engine.llm.get_tokenizer(), self.engine.max_model_len)
        return self._prompt_chars

    # -- engine jobs -----------------------------------------------------------------------
    def run(self, fn: Any, *args: Any, timeout: float, **kwargs: Any) -> Any:
        """Run fn on the engine thread; bad input -> 400, a slow engine -> 504 (the call is called
        off at the engine's next step), a stuck or dead one -> 503."""
        job, cancel = _job(functools.partial(fn, *args, **kwargs), timeout, getattr(fn, "__name__", None))
        try:
            return self.worker.ask(job, timeout)
        except FutureTimeout:
            call_off(job, cancel, f"past its timeout ({timeout:g} s)")
            raise ServerError(504, f"the engine did not answer within {timeout:g} s") from None
        except Exception as exc:
            raise as_answer(exc) from None

    async def answer(self, request: Any, fn: Any, *args: Any, timeout: float, **kwargs: Any) -> tuple[Any, int]:
        """(fn(engine, *args, **kwargs), the weights version it ran on), run on the engine thread for
        a request (a Starlette Request) and called off if its client goes (see grpocli.server.inflight);
        refused while the weights change or are incomplete."""
        job, cancel = _job(self._generation(fn, *args, **kwargs), timeout)
        with self.lock:  # refused or queued at once: no reload can be queued in between
            self._refuse_while_updating()
            self.worker.put(job)
        try:
            return await wait_for(job, cancel, request, timeout)
        except Exception as exc:
            raise as_answer(exc) from None

    def generate(self, prompts: list, n: int, sampling: Any, *, seed: int | None, logprobs: bool,
                 timeout: float) -> Any:
        """The engine's Generated for ``prompts`` (from a thread that is not the event loop's)."""
        with self.lock:
            self._refuse_while_updating()
        call = self._generation(lambda engine: engine.generate(prompts, n, sampling, logprobs=logprobs, seed=seed))
        return self.run(call, timeout=timeout)[0]

    def _generation(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(engine, ...) with the weights version, checked on the engine thread: a reload that ran
        before it and failed has left the weights incomplete (409)."""
        def call() -> tuple[Any, int]:
            if self.broken:
                raise ServerError(409, self.broken)
            return fn(self.engine, *args, **kwargs), self.version

        name = getattr(fn, "__name__", "<lambda>")
        call.__name__ = name if name != "<lambda>" else "a generation"
        return call

    def _in_order(self, jobs: list[Job]) -> None:
        """The worker's schedule: each job as it came, under its own deadline (``run``'s timeout)."""
        for job in jobs:
            call, limit, cancel = job.args
            self._running = cancel
            try:
                self.worker.run(job, self._guarded, call, label=job.kind, limit=limit)
            finally:
                self._running = None

    def _guarded(self, call: Any) -> Any:
        """call() on the engine thread; on any error the engine is cleaned up before the next call."""
        try:
            return call()
        except BaseException:
            self._recover()
            raise

    def _recover(self) -> None:
        """Abort every request still inside vLLM (a failed or called-off step leaves them there, and
        the next call would step them again, forever); mark the engine dead if even that fails."""
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

    def weights_state(self) -> tuple[str, str] | None:
        """None when the weights are one complete version; else ("updating", why) while an update is
        in flight, or ("weights_incomplete", why) after one failed (generation is refused meanwhile)."""
        with self.lock:
            self._reap()
            u = self.update
        if u is not None:
            total = f" of {len(u.expected)}" if u.expected else ""
            return "updating", (f"weight update {u.id} is in progress ({len(u.received)}{total} tensors so far); "
                                f"generation is refused (409) until it ends; the weights are version {self.version}")
        if self.broken:
            return "weights_incomplete", self.broken
        return None

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
        done = self.update.future if self.update is not None else None
        if done is not None and done.done() and (done.cancelled() or done.exception()):
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
            if transport in ("gloo", "nccl") and self.group.backend != transport:
                raise ServerError(409, f"no {transport} group is open; POST /weights/group first")
            bad = [f"{a} -> {t}" for a, t in aliases.items() if expected and t not in expected]
            problems = spec_problems(expected, spec) if spec is not None and expected else []
            if bad or problems:
                raise ServerError(409, "the weights do not fit the engine's model: "
                                  + "; ".join([*(f"alias of an unknown tensor: {b}" for b in bad), *problems]))
            u = WeightUpdate(expected, aliases, timeout, transport, complete=complete)
            # no deadline: its waits are bounded by the update's timeout
            u.future = self.worker.submit(Job("load_weights", (functools.partial(self._load, u), None, Cancel())))
            self.update = u
            return u

    def _load(self, u: WeightUpdate) -> tuple[int, int]:
        """The reload (engine thread): (tensors loaded, the new version); on failure the weights are
        marked incomplete here, before any generation queued behind it runs."""
        try:
            count = self.engine.load_weights(u.tensors())
        except BaseException as exc:
            self.broken = (f"the weights are incomplete: update {u.id} failed ({type(exc).__name__}: {exc}); "
                           "send a complete weight update or restart the server")
            raise
        self.version += 1
        if u.whole():  # a partial (TRL) update does not repair
            self.broken = None
        return count, self.version

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
        group = self.group.wait(u.timeout)
        device = (self.device or "cuda") if self.group.backend == "nccl" else "cpu"
        use_device(self.device)  # a request thread: the engine's GPU is its current one too
        flat = torch.empty(bucket_bytes(specs), dtype=torch.uint8, device=device)
        try:
            broadcast(group, flat, u.timeout, root=0)
        except Exception as exc:
            raise ServerError(504, f"the bucket did not arrive over {self.group.backend}: {exc}") from None
        u.put(unflatten_bucket(flat, specs))
        return len(specs)

    def end(self, update_id: str, *, abort: bool = False) -> dict[str, Any]:
        """Close the update's stream and wait for the engine; abort leaves the weights incomplete."""
        u = self.current(update_id)
        try:
            u.put_item(ABORT if abort else END)
            count, version = u.future.result(timeout=u.timeout)
        except FutureTimeout:
            self.broken = f"the weights are incomplete: update {u.id} did not finish within {u.timeout:g} s"
            raise ServerError(504, self.broken) from None
        except ServerError:
            raise
        except Exception:
            detail = self.broken or f"the weights are incomplete: update {u.id} failed ({reason(u.future)})"
            if abort:
                return {"aborted": True, "detail": detail}
            raise ServerError(409, detail) from None
        finally:
            with self.lock:
                if self.update is u:
                    self.update = None
        return {"weights_version": version, "tensors": count, "seconds": time.perf_counter() - u.started}

    # -- the broadcast group ------------------------------------------------------------
    def open_group(self, backend: str, timeout: float) -> int:
        """The port of a TCPStore on the server's own address for the client to join as rank 0
        (see grpocli.server.group)."""
        with self.lock:
            self._reap()
            if self.update is not None and self.update.transport in ("gloo", "nccl"):
                raise ServerError(409, f"a weight update ({self.update.id}) is using the {self.update.transport} "
                                       "group; wait for it to end")
            return self.group.open(backend, timeout)

    def close(self, wait: float = 10.0) -> bool:
        """Stop: the running job is called off, an update in flight aborted, the group closed, and the
        engine shut down once its thread has stopped. False (the engine left as it is) when that thread
        is still inside a call after ``wait`` s: stuck, and no safe shutdown can run beside it."""
        running, u = self._running, self.update
        if running is not None:
            running.set("the server is closing")
        if u is not None:
            with contextlib.suppress(queue.Full):
                u.queue.put_nowait(ABORT)
        self.group.close()
        self.worker.close()
        self.worker.thread.join(wait)
        if self.worker.thread.is_alive():
            return False
        self.engine.close()
        return True


def _job(call: Any, timeout: float, label: str | None = None) -> tuple[Job, Cancel]:
    """A job of ``call`` under a deadline of ``timeout`` s, labelled (for /health) with its name."""
    cancel = Cancel()
    return Job(label or getattr(call, "__name__", "an engine call"), (call, timeout, cancel)), cancel


def as_answer(exc: Exception) -> Exception:
    """An engine call's exception as the request's answer: bad input -> 400, a call called off
    while someone still waits (the server closing) -> 503, the rest as it is."""
    if isinstance(exc, Cancelled):
        return ServerError(503, f"the engine call was called off: {exc}")
    if isinstance(exc, ServerError) or not is_bad_input(exc):
        return exc
    return ServerError(400, f"{type(exc).__name__}: {exc}")


def is_bad_input(exc: Exception) -> bool:
    """Errors that mean the request was wrong (vLLM's VLLMClientError family, ValueError, ...)."""
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return True
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return False
    return isinstance(exc, VLLMClientError)


def text_limit(tokenizer: Any, max_model_len: int) -> int:
    """The most characters max_model_len tokens of ``tokenizer`` can spell (each token at most its
    longest vocabulary entry: a byte-level entry has a character per byte, a character at least one)."""
    try:
        longest = max(map(len, tokenizer.get_vocab()), default=1)
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: a generous bound
        longest = 64
    return max_model_len * max(longest, 1)


__all__ = ["EngineHost", "WeightUpdate", "as_answer", "is_bad_input", "text_limit"]
