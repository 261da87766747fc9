"""generation.backend = "vllm-server": generate on a `grpo vllm-serve` process, send it new weights.

The client works as TRL's ``VLLMClient`` does (wait for /health, generate from token ids, push
the policy's weights; the server resets its prefix cache after each update) with grpo's server
protocol (grpocli/wire/generation.py), through grpocli.wire.client. The weights are sent when the backend opens and at each
``sync_weights`` (the trainer calls it after each generation cycle's optimizer steps), in buckets
(one HTTP call or one broadcast per bucket, not per tensor); the first update sends the full spec
for the server to check, and every call has a timeout (``vllm.server_timeout``) that ends in a
UserError naming the URL and what to do, never a hang. Transports: "http" (safetensors bodies;
CPU or GPU), "gloo" (a process group, CPU), "nccl" (GPUs); the default is nccl when the trainer
and every server are on GPUs and no server says it is on the trainer's own GPU (NCCL refuses two
ranks on one GPU; /info names the server's GPU by UUID, and a server that does not say gets
http), else http; the environment variable GRPO_VLLM_WEIGHT_TRANSPORT overrides it, except that
nccl to a server on the trainer's GPU is a UserError. The API
key, if the server has one, is read from GRPO_VLLM_API_KEY (an environment variable, so it is
never written to config.resolved.toml).

Every generate request carries one seed per prompt, so a run is reproducible and a resumed run
continues exactly: the seeds are drawn from torch's RNG, which the trainer seeds from the run's
seed and process index (as the colocated engine is seeded) and which checkpoints save and resume
restores, so step N of a resumed run draws what step N of the uninterrupted run drew.

Several servers (``vllm.server_url`` a list) form a fleet: grpocli/generation/fleet.py spreads
the prompts over them by whole groups and sends the weights to all of them.

The trainer's side needs no vLLM and no server package: its HTTP is grpocli.wire.client's (httpx).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, PromptEncoder, Sampling
from grpocli.generation.devices import cuda_device, gpu_identity, same_gpu
from grpocli.generation.weights import (
    DEFAULT_BUCKET_BYTES,
    PolicyWeights,
    buckets,
    dtype_from_name,
    flatten_bucket,
    pack_bucket,
    policy_weights,
)
from grpocli.parallel import Parallel
from grpocli.wire import generation as wire
from grpocli.wire.client import BadAnswer, Client, Refused, Unavailable, read_answer

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection

START_HINT = "start one: grpo vllm-serve --model MODEL_DIR --port 8000 (and vllm.server_url = 'http://127.0.0.1:8000')"


class ServerUnavailable(UserError):
    """The server did not answer: refused or dropped the connection, timed out, or failed (HTTP 5xx).
    A fleet may drop such a server (vllm.drop_failed_servers); a 4xx refusal is never dropped."""


class ServerClient:
    """Calls to one `grpo vllm-serve`; each bounded by ``timeout`` seconds, failures as UserError. Requests are
    built with ``model_construct``: the server checks each (grpocli/wire/generation.py)."""

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
                    f"grpo vllm-serve at {self.url} did not answer {method} {path} within {timeout:g} s",
                    where="vllm.server_timeout", valid="a longer timeout, or a server that is not stuck",
                    hint="raise vllm.server_timeout, and look at the server's terminal for errors",
                ) from None
            raise ServerUnavailable(  # refused, reset, cut short
                f"no grpo vllm-serve answers at {self.url} ({exc.reason})", where="vllm.server_url",
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
        return error(f"grpo vllm-serve at {self.url} refused {exc.path}: HTTP {exc.status}: {exc.detail}",
                     where="vllm.server_url", hint=hint)

    def _bad(self, method: str, path: str, exc: BadAnswer) -> UserError:
        return UserError(f"grpo vllm-serve at {self.url} answered {method} {path} outside its protocol: {exc.what}",
                         where=f"{exc.field} of the answer",
                         valid=f"an answer of grpo vllm-serve, protocol {wire.PROTOCOL_VERSION}",
                         hint="pip install the same grpocli on both machines, then restart the server")

    def wait_until_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Poll /health until the server answers (it may still be starting), then read /info."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", wire.HEALTH_PATH, timeout=min(5.0, timeout))
                break
            except UserError as err:
                if time.monotonic() + 1.0 > deadline:
                    raise UserError(f"{err.what}; waited {timeout:g} s", where=err.where, valid=err.valid,
                                    hint=err.hint) from None
                time.sleep(1.0)
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
        """Announce a flat bucket over HTTP while broadcasting it; whichever fails first is reported."""
        with ThreadPoolExecutor(1) as pool:
            announced = pool.submit(self.call, "POST", wire.BROADCAST_PATH, wire.BroadcastBucket.model_construct(
                update_id=uid, tensors=[wire.Tensor.model_construct(**s.to_json()) for s in specs]))
            work = self.group.broadcast(flat, 0, timedelta(seconds=self.timeout))
            deadline = time.monotonic() + self.timeout
            while not work.is_completed():
                if announced.done() and announced.exception() is not None:
                    self.group, self.group_backend = None, None  # out of step: rebuilt next time
                    raise announced.exception()
                if time.monotonic() > deadline:
                    self.group, self.group_backend = None, None
                    raise ServerUnavailable(
                        f"the weight broadcast to {self.url} did not finish within {self.timeout:g} s",
                        where="vllm.server_timeout", hint="export GRPO_VLLM_WEIGHT_TRANSPORT=http")
                time.sleep(0.002)
            try:
                work.wait()
            except RuntimeError as exc:  # the peer went away: gloo/NCCL's DistBackendError
                self.group, self.group_backend = None, None
                raise ServerUnavailable(f"the weight broadcast to {self.url} failed: {exc}",
                                        where="vllm.server_url", hint="look at the server's terminal") from None
            announced.result()



class VllmServerBackend(PromptEncoder):
    """GenerationBackend on one or more `grpo vllm-serve` (vllm.server_url); the policy's weights are
    sent to every server when it opens."""

    def __init__(self, model: Any, tokenizer: Any, *, vllm_section: VllmSection, max_prompt_length: int,
                 transport: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 parallel: Parallel | None = None) -> None:
        from grpocli.generation.fleet import ServerFleet

        v = vllm_section
        key = os.environ.get(wire.KEY_ENV)
        self.fleet = ServerFleet([ServerClient(url, timeout=v.server_timeout, api_key=key) for url in v.server_urls],
                                 drop_failed=v.drop_failed_servers)
        self.client = self.fleet.clients[0]  # the first server (calls that need only one)
        self.info = self.fleet.wait_until_ready()
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.parallel = parallel or Parallel.alone()
        self.dtype = dtype_from_name(self.info["dtype"])
        # only the main process sends weights: its GPU is the one that must not be the server's
        trainer = (gpu_identity(cuda_device(self.parallel.device) or cuda_device(_param_device(model)))
                   if self.parallel.main else None)
        self.transport = choose_transport(transport or os.environ.get("GRPO_VLLM_WEIGHT_TRANSPORT"), trainer,
                                          self.info)
        self.bucket_bytes = bucket_bytes
        self.checked = False
        self.last_sync: dict[str, Any] = {}
        self.sync_weights(model)  # the server may hold other weights than the policy (resume, base model)

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        return self.generate_ids(self.encode_prompts(prompts), n, sampling)

    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions per prompt; each prompt's seed is drawn here, whichever server samples it."""
        return self.fleet.generate(prompt_ids, n, sampling, seeds=request_seeds(len(prompt_ids)))

    def sync_weights(self, model: Any) -> None:
        """Main process: send the weights to every server (the spec first, once); everyone: wait for it."""
        with policy_weights(model, self.dtype, self.parallel) as weights:
            if self.parallel.main:
                self.last_sync = self.fleet.update_weights(weights, check=not self.checked, transport=self.transport,
                                                           max_bytes=self.bucket_bytes)
                self.checked = True
            else:
                weights.take_part()  # FSDP2: each tensor the main process sends is gathered by all
        self.parallel.wait()

    def metrics(self) -> dict[str, float]:
        """vllm/servers, vllm/servers_dropped, vllm/prompts_resent with several servers; else {}."""
        return self.fleet.metrics()

    def close(self) -> None:
        self.fleet.close()  # the servers outlive the run; stop each with POST /close or Ctrl-C


def request_seeds(count: int) -> list[int]:
    """One seed per prompt of a request, drawn from torch's (run-seeded, checkpointed) RNG.

    vLLM gives a prompt's n completions the seeds seed + 0 .. seed + n - 1, so the draws stay below
    2**62: far apart from each other and, with the offsets, inside vLLM's range (a 64-bit long).
    """
    import torch

    return torch.randint(0, 2**62, (count,), dtype=torch.int64).tolist()


def choose_transport(asked: str | None, trainer: dict[str, Any] | None, info: dict[str, Any]) -> str:
    """The weight transport: ``asked`` (GRPO_VLLM_WEIGHT_TRANSPORT) if the servers offer it, else
    nccl where the trainer (``gpu_identity`` of the sending process's device) is on a GPU, the
    servers offer nccl and each says it is on another GPU, else http. ``info``: /info (a fleet's
    lists each server's device under "devices"). NCCL between two ranks on one GPU fails, so nccl
    asked for a server on the trainer's GPU is a UserError. ``trainer`` None: this process sends
    nothing (not the main one); only whether the servers offer ``asked`` is checked."""
    offered = info["transports"]
    devices = info.get("devices") or [info.get("device")]
    same = [same_gpu(trainer, d) for d in devices] if trainer is not None else []
    trainer = trainer or {}
    if asked:
        if asked == "nccl" and any(same):
            gpu = trainer.get("name") or "GPU"
            raise UserError(
                f"the weight transport nccl cannot reach a server on the trainer's own GPU ({gpu} "
                f"{trainer.get('uuid')}): NCCL refuses two ranks on one GPU", where="GRPO_VLLM_WEIGHT_TRANSPORT",
                valid="http (or unset: grpo picks http for a server on the trainer's GPU)",
                hint="unset GRPO_VLLM_WEIGHT_TRANSPORT, or start grpo vllm-serve on another GPU "
                     "(CUDA_VISIBLE_DEVICES=1 grpo vllm-serve ...)")
        if asked not in offered:
            raise UserError(f"the server offers no {asked!r} weight transport",
                            where="GRPO_VLLM_WEIGHT_TRANSPORT", valid=", ".join(offered))
        return asked
    apart = bool(same) and all(s is False for s in same)
    return "nccl" if trainer.get("type") == "cuda" and "nccl" in offered and apart else "http"


def _param_device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None


__all__ = ["ServerClient", "ServerUnavailable", "VllmServerBackend", "choose_transport", "request_seeds"]
