"""generation.backend = "vllm-server": generate on a `grpo vllm-serve` process or a stock vLLM server
(grpocli.generation.stock_client: `vllm serve` with its RL API and a weight-transfer engine), send it new
weights.

The client works as TRL's ``VLLMClient`` does (wait for /health, generate from token ids, push
the policy's weights; the server resets its prefix cache after each update) with grpo's server
protocol (grpocli/wire/generation.py), one ``ServerClient`` per server
(grpocli.generation.server_client). The weights are sent when the backend opens and at each
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

import os
from functools import partial
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, PromptEncoder, Sampling
from grpocli.generation.devices import cuda_device, gpu_identity, same_gpu
from grpocli.generation.fleet import ServerFleet
from grpocli.generation.server_client import ServerClient
from grpocli.generation.stock_client import client_for
from grpocli.generation.weights import DEFAULT_BUCKET_BYTES, dtype_from_name, policy_weights
from grpocli.parallel import Parallel
from grpocli.wire.generation import KEY_ENV

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection


class VllmServerBackend(PromptEncoder):
    """GenerationBackend on one or more `grpo vllm-serve` (vllm.server_url); the policy's weights are
    sent to every server when it opens."""

    def __init__(self, model: Any, tokenizer: Any, *, vllm_section: VllmSection, max_prompt_length: int,
                 transport: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 parallel: Parallel | None = None) -> None:
        v = vllm_section
        key = os.environ.get(KEY_ENV)
        probes = ServerFleet([ServerClient(url, timeout=v.server_timeout, api_key=key) for url in v.server_urls])
        kinds = probes.each({c: partial(client_for, c) for c in probes.clients}, what="start", may_drop=False)
        self.fleet = ServerFleet([kinds[c] for c in probes.clients], drop_failed=v.drop_failed_servers)
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
                self.last_sync = {**self.fleet.update_weights(weights, check=not self.checked, transport=self.transport,
                                                              max_bytes=self.bucket_bytes),
                                  "bytes": float(sum(spec.nbytes for spec in weights.specs()))}
                self.checked = True
            else:
                weights.take_part()  # FSDP2: each tensor the main process sends is gathered by all
        self.parallel.wait()

    def start_inflight(self, version: int, *, kv_cache: str = "keep") -> Any:
        """generation.pipeline = "inflight" on stock vLLM servers (grpocli.generation.server_inflight): vLLM's
        pause with the requests kept, the weights, resume. grpo vllm-serve cannot keep requests over a sync."""
        from grpocli.generation.server_inflight import ServerInflight
        from grpocli.generation.stock_client import StockClient

        own = [c.url for c in self.fleet.clients if not isinstance(c, StockClient)]
        if own:
            raise UserError(f"generation.pipeline = \"inflight\" needs servers that pause with their requests kept; "
                            f"grpo vllm-serve at {', '.join(own)} cannot", where="generation.pipeline",
                            valid="stock vLLM servers (docs/vllm.md: VLLM_SERVER_DEV_MODE=1 vllm serve MODEL "
                                  "--weight-transfer-config ... --logprobs-mode processed_logprobs --enable-scale-out)",
                            hint="start stock vLLM servers, or set generation.pipeline = \"sync\"")
        return ServerInflight(self.fleet.live, send=self.sync_weights, version=version, kv_cache=kv_cache)

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
    chosen = "nccl" if trainer.get("type") == "cuda" and "nccl" in offered and apart else "http"
    return chosen if chosen in offered else offered[0]  # a stock vLLM server offers its engine's transport only


def _param_device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None


__all__ = ["VllmServerBackend", "choose_transport", "request_seeds"]
