"""The trainer's client of one `grpo vllm-serve`: generate, weight updates (HTTP buckets, or gloo/NCCL
broadcasts announced over HTTP), the wait for a starting server.

The protocol is grpocli/wire/generation.py's, spoken through grpocli.wire.client: every call has a
timeout (``vllm.server_timeout``) that bounds the whole answer and ends in a UserError naming the URL
and what to do, never a hang. The API key, if the server has one, is sent as a Bearer token (the
backend reads it from GRPO_VLLM_API_KEY). Failures come in two kinds: ``ServerUnavailable`` (no
answer: refused or dropped connection, time up, HTTP 5xx), which a fleet may drop the server for
(grpocli.generation.fleet), and any other UserError (a 4xx refusal, an answer outside the protocol),
which every server would give alike.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, Sampling
from grpocli.generation.weights import DEFAULT_BUCKET_BYTES, PolicyWeights, buckets, flatten_bucket, pack_bucket
from grpocli.wire import generation as wire
from grpocli.wire.client import BadAnswer, Client, Refused, Unavailable, read_answer

START_HINT = "start one: grpo vllm-serve --model MODEL_DIR --port 8000 (and vllm.server_url = 'http://127.0.0.1:8000')"


class ServerUnavailable(UserError):
    """The server did not answer: refused or dropped the connection, timed out, or failed (HTTP 5xx).
    A fleet may drop such a server (vllm.drop_failed_servers); a 4xx refusal is never dropped."""


class ServerClient:
    """Calls to one `grpo vllm-serve`; each bounded by ``timeout`` seconds, failures as UserError. Requests are
    built with ``model_construct``: the server checks each (grpocli/wire/generation.py)."""

    #: How errors name the server, and what to do about a broadcast that does not finish.
    kind = "grpo vllm-serve"
    stalled_hint = "export GRPO_VLLM_WEIGHT_TRANSPORT=http"

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None) -> None:
        self.http = Client(url, timeout=timeout, api_key=api_key)
        self.url, self.timeout, self.api_key = self.http.url, timeout, api_key
        self.group: Any = None
        self.group_backend: str | None = None

    # -- HTTP ----------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
             answer: Any = None) -> Any:
        """The answer as JSON, or as the ``answer`` model (grpocli.wire.generation); failures as UserError."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return self.http.call(method, path, body, answer=answer, timeout=timeout)
        except Refused as exc:
            raise self._refused(exc) from None
        except Unavailable as exc:
            if exc.timed_out:
                raise ServerUnavailable(
                    f"{self.kind} at {self.url} did not answer {method} {path} within {timeout:g} s",
                    where="vllm.server_timeout", valid="a longer timeout, or a server that is not stuck",
                    hint="raise vllm.server_timeout, and look at the server's terminal for errors",
                ) from None
            raise ServerUnavailable(  # refused, reset, cut short
                f"no {self.kind} answers at {self.url} ({exc.reason})", where="vllm.server_url",
                valid="the URL of a running `grpo vllm-serve`", hint=START_HINT,
            ) from None
        except BadAnswer as exc:
            raise self._bad(method, path, exc) from None

    def _refused(self, exc: Refused) -> UserError:
        hint = {401: f"export {wire.KEY_ENV}=<the server's --api-key> before grpo train",
                409: "the server's model must be the policy's architecture: grpo vllm-serve --model <the model "
                     "you train>; if an update failed midway, the next complete one repairs it"}.get(
            exc.status, "look at the server's terminal for the full error")
        error = ServerUnavailable if exc.status >= 500 else UserError  # 5xx: its engine is stuck, dead or failing
        return error(f"{self.kind} at {self.url} refused {exc.path}: HTTP {exc.status}: {exc.detail}",
                     where="vllm.server_url", hint=hint)

    def _bad(self, method: str, path: str, exc: BadAnswer) -> UserError:
        return UserError(f"{self.kind} at {self.url} answered {method} {path} outside its protocol: {exc.what}",
                         where=f"{exc.field} of the answer",
                         valid=f"an answer of grpo vllm-serve, protocol {wire.PROTOCOL_VERSION}",
                         hint="pip install the same grpocli on both machines, then restart the server")

    def wait_for_health(self, timeout: float | None = None) -> None:
        """Poll /health until the server answers (it may still be starting); /health is grpo's and vLLM's."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", wire.HEALTH_PATH, timeout=min(5.0, timeout))
                return
            except UserError as err:
                if time.monotonic() + 1.0 > deadline:
                    raise UserError(f"{err.what}; waited {timeout:g} s", where=err.where, valid=err.valid,
                                    hint=err.hint) from None
                time.sleep(1.0)

    def wait_until_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Poll /health until the server answers (it may still be starting), then read /info."""
        self.wait_for_health(timeout)
        info = self.call("GET", wire.INFO_PATH)
        if not isinstance(info, dict) or info.get("protocol") != wire.PROTOCOL_VERSION:
            raise UserError(
                f"the server at {self.url} is not a grpo vllm-serve of protocol {wire.PROTOCOL_VERSION} "
                f"(it says {info.get('protocol') if isinstance(info, dict) else info!r})", where="vllm.server_url",
                valid="`grpo vllm-serve` from the same grpo version as the trainer",
                hint="pip install the same grpocli on both machines, then restart the server",
            )
        try:
            return read_answer(wire.EngineInfo, info).model_dump()
        except BadAnswer as exc:
            raise self._bad("GET", wire.INFO_PATH, exc) from None

    # -- generation ---------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Sampling, *,
                 seed: int | list[int] | None = None) -> Generated:
        """n completions per prompt; ``seed``: one for every prompt, one per prompt, or none (the engine's)."""
        body = wire.GenerateRequest.model_construct(  # unchecked: the server checks every body
            prompt_ids=prompt_ids, n=n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty, stop=list(sampling.stop), seed=seed, logprobs=True)
        out = self.call("POST", wire.GENERATE_PATH, body, answer=wire.GenerateAnswer)
        return Generated(prompt_ids=out.prompt_ids, completion_ids=out.completion_ids, truncated=out.truncated,
                         logprobs=out.logprobs)

    # -- weights -------------------------------------------------------------------------
    def update_weights(self, weights: PolicyWeights, *, check: bool, transport: str = "http",
                       max_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, Any]:
        """Send every tensor in buckets; with check, the server first compares the full spec."""
        uid = self.begin_update(weights, check=check, transport=transport)
        try:
            device = "cuda" if transport == "nccl" else "cpu"
            for bucket in buckets(weights.unique(), max_bytes):
                self.send_bucket(uid, pack_bucket(bucket) if transport == "http" else flatten_bucket(bucket, device))
            return self.end_update(uid)
        except BaseException:
            self.abort_update(uid)
            raise

    def begin_update(self, weights: PolicyWeights, *, check: bool, transport: str) -> str:
        """Open an update (joining the server's gloo/NCCL group first where needed); its id."""
        if transport != "http" and self.group_backend != transport:
            self.open_group(transport)
        spec = [wire.Tensor.model_construct(**s.to_json()) for s in weights.specs()] if check else None
        request = wire.BeginUpdate.model_construct(transport=transport, aliases=weights.aliases, timeout=self.timeout,
                                                   spec=spec)
        return self.call("POST", wire.BEGIN_PATH, request, answer=wire.UpdateBegun).update_id

    def send_bucket(self, uid: str, payload: bytes | tuple[Any, list]) -> None:
        """One bucket: pack_bucket's bytes over HTTP, or flatten_bucket's (flat, specs) over the group."""
        if isinstance(payload, bytes):
            self.call("POST", f"{wire.BUCKET_PATH}?update_id={uid}", payload)
        else:
            self._broadcast(uid, *payload)

    def end_update(self, uid: str) -> dict[str, Any]:
        return self.call("POST", wire.END_PATH, wire.EndUpdate.model_construct(update_id=uid))

    def abort_update(self, uid: str) -> None:
        """Leave the server free for the next update (best effort: it may be gone)."""
        with contextlib.suppress(UserError):
            self.call("POST", wire.ABORT_PATH, wire.EndUpdate.model_construct(update_id=uid), timeout=min(self.timeout, 10.0))

    def open_group(self, backend: str) -> None:
        """Join the server's gloo/NCCL group as rank 0 (the sender of every bucket)."""
        import torch.distributed as dist

        from grpocli.generation.weights import open_group

        port = self.call("POST", wire.GROUP_PATH, wire.OpenGroup.model_construct(backend=backend, timeout=self.timeout),
                         answer=wire.GroupOpened).port
        server = urllib.parse.urlparse(self.url).hostname or "127.0.0.1"
        try:
            store = dist.TCPStore(server, port, 2, False, timedelta(seconds=self.timeout))
            local = "127.0.0.1" if server in ("127.0.0.1", "localhost") else None
            self.group = open_group(backend, store, 0, 2, self.timeout, hostname=local)
        except Exception as exc:
            raise UserError(f"cannot join the server's {backend} group at {server}:{port}: {exc}",
                            where="GRPO_VLLM_WEIGHT_TRANSPORT", valid="http, or a port the server can be reached on",
                            hint="export GRPO_VLLM_WEIGHT_TRANSPORT=http") from None
        self.group_backend = backend

    def _broadcast(self, uid: str, flat: Any, specs: list) -> None:
        """Announce a flat bucket over HTTP (grpo's /weights/broadcast) while broadcasting it."""
        self.announced_broadcast(flat, "POST", wire.BROADCAST_PATH, wire.BroadcastBucket.model_construct(
            update_id=uid, tensors=[wire.Tensor.model_construct(**s.to_json()) for s in specs]))

    def announced_broadcast(self, flat: Any, method: str, path: str, body: Any) -> None:
        """Call ``method path body`` (the announcement the server receives the bucket by) while broadcasting
        ``flat`` from rank 0 of the group; whichever fails first is reported, and the group is then dropped
        (out of step: rebuilt next time)."""
        with ThreadPoolExecutor(1) as pool:
            announced = pool.submit(self.call, method, path, body)
            work = self.group.broadcast(flat, 0, timedelta(seconds=self.timeout))
            deadline = time.monotonic() + self.timeout
            while not work.is_completed():
                if announced.done() and announced.exception() is not None:
                    self.group, self.group_backend = None, None
                    raise announced.exception()
                if time.monotonic() > deadline:
                    self.group, self.group_backend = None, None
                    raise ServerUnavailable(
                        f"the weight broadcast to {self.url} did not finish within {self.timeout:g} s",
                        where="vllm.server_timeout", hint=self.stalled_hint)
                time.sleep(0.002)
            try:
                work.wait()
            except RuntimeError as exc:  # the peer went away: gloo/NCCL's DistBackendError
                self.group, self.group_backend = None, None
                raise ServerUnavailable(f"the weight broadcast to {self.url} failed: {exc}",
                                        where="vllm.server_url", hint="look at the server's terminal") from None
            announced.result()


__all__ = ["START_HINT", "ServerClient", "ServerUnavailable"]
