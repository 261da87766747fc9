"""generation.backend = "vllm-server": generate on vLLM servers (`grpo vllm-serve`: stock `vllm serve` with
its RL API and a weight-transfer engine), send them new weights.

The client works as TRL's ``VLLMClient`` does (wait for /health, generate from token ids, push the
policy's weights through vLLM's weight-transfer engine; the server resets its prefix cache after each
update), one ``ServerClient`` per server (grpocli.generation.server_client). The weights are sent when
the backend opens and at each ``sync_weights`` (the trainer calls it after each generation cycle's
optimizer steps), in buckets (one broadcast per bucket, not per tensor); every call has a timeout
(``vllm.server_timeout``) that ends in a UserError naming the URL and what to do, never a hang. The
transport is the server's engine: "nccl" (GPUs) or "gloo" (the grpo_gloo engine, any machine); the
environment variable GRPO_VLLM_WEIGHT_TRANSPORT, if set, must name it. The API key, if the server has
one, is read from GRPO_VLLM_API_KEY (an environment variable, so it is never written to
config.resolved.toml).

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
from grpocli.generation.fleet import ServerFleet
from grpocli.generation.lora_adapter import adapter_versions, server_lacks
from grpocli.generation.server_client import ServerClient
from grpocli.generation.weights import DEFAULT_BUCKET_BYTES, dtype_from_name, policy_weights
from grpocli.parallel import Parallel
from grpocli.wire.vllm_api import KEY_ENV

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection


class VllmServerBackend(PromptEncoder):
    """GenerationBackend on one or more vLLM servers (vllm.server_url); the policy's weights are sent to
    every server when it opens."""

    def __init__(self, model: Any, tokenizer: Any, *, vllm_section: VllmSection, max_prompt_length: int,
                 transport: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 parallel: Parallel | None = None) -> None:
        v = vllm_section
        key = os.environ.get(KEY_ENV)
        self.fleet = ServerFleet([ServerClient(url, timeout=v.server_timeout, api_key=key) for url in v.server_urls],
                                 drop_failed=v.drop_failed_servers)
        self.client = self.fleet.clients[0]  # the first server (calls that need only one)
        self.info = self.fleet.wait_until_ready()
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.parallel = parallel or Parallel.alone()
        self.dtype = dtype_from_name(self.info["dtype"])
        self.transport = choose_transport(transport or os.environ.get("GRPO_VLLM_WEIGHT_TRANSPORT"), self.info)
        self.bucket_bytes = bucket_bytes
        self.last_sync: dict[str, Any] = {}
        # a LoRA policy: its adapters alone, where the servers can load them (grpocli.generation.lora_adapter)
        self.adapters = adapter_versions(model, v, inflight=False, parallel=self.parallel,
                                         server=server_lacks(model, self.info["lora_rank"], v.server_urls))
        self.sync_weights(model)  # the server may hold other weights than the policy (resume, base model)

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        return self.generate_ids(self.encode_prompts(prompts), n, sampling)

    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions per prompt; each prompt's seed is drawn here, whichever server samples it."""
        return self.fleet.generate(prompt_ids, n, sampling, seeds=request_seeds(len(prompt_ids)))

    def sync_weights(self, model: Any) -> None:
        """Main process: send the weights (or the adapters alone) to every server; everyone: wait for it."""
        if self.adapters is not None:
            if self.parallel.main:
                size = self.adapters.save(model)
                path = str(self.adapters.path)
                self.fleet.each({c: partial(c.use_adapter, self.adapters.name, path) for c in self.fleet.live},
                                what="the adapter update")
                self.last_sync = {"bytes": float(size), "tensors": float(self.adapters.tensors),
                                  "weights_version": self.adapters.name}
            self.parallel.wait()
            return
        with policy_weights(model, self.dtype, self.parallel) as weights:
            if self.parallel.main:
                self.last_sync = {**self.fleet.update_weights(weights, transport=self.transport,
                                                              max_bytes=self.bucket_bytes),
                                  "bytes": float(sum(spec.nbytes for spec in weights.specs()))}
            else:
                weights.take_part()  # FSDP2: each tensor the main process sends is gathered by all
        self.parallel.wait()

    def start_inflight(self, version: int, *, kv_cache: str = "keep") -> Any:
        """generation.pipeline = "inflight" (grpocli.generation.server_inflight): vLLM's pause with the requests
        kept, the weights, resume."""
        from grpocli.generation.server_inflight import ServerInflight

        if self.adapters is not None:  # requests kept over a sync would need two adapter versions at once
            raise UserError("generation.pipeline = \"inflight\" keeps requests over a sync, which adapter versions "
                            "do not yet", where="vllm.lora_sync", valid="\"merged\" with generation.pipeline = "
                            "\"inflight\"", hint="set vllm.lora_sync = \"merged\"")
        return ServerInflight(self.fleet.live, send=self.sync_weights, version=version, kv_cache=kv_cache)

    def metrics(self) -> dict[str, float]:
        """weight_sync/bytes and weight_sync/tensors of the last sync; vllm/servers, vllm/servers_dropped,
        vllm/prompts_resent with several servers."""
        synced = {f"weight_sync/{k}": float(self.last_sync[k]) for k in ("bytes", "tensors") if k in self.last_sync}
        return {**synced, **self.fleet.metrics()}

    def close(self) -> None:
        if self.adapters is not None:
            self.adapters.close()
        self.fleet.close()  # the servers outlive the run; stop each with Ctrl-C


def request_seeds(count: int) -> list[int]:
    """One seed per prompt of a request, drawn from torch's (run-seeded, checkpointed) RNG.

    vLLM gives a prompt's n completions the seeds seed + 0 .. seed + n - 1, so the draws stay below
    2**62: far apart from each other and, with the offsets, inside vLLM's range (a 64-bit long).
    """
    import torch

    return torch.randint(0, 2**62, (count,), dtype=torch.int64).tolist()


def choose_transport(asked: str | None, info: dict[str, Any]) -> str:
    """The weight transport: the one the servers' weight-transfer engine takes (``info["transports"]``: those
    every server of the fleet offers); ``asked`` (GRPO_VLLM_WEIGHT_TRANSPORT), if set, must be it."""
    offered = info["transports"]
    if not offered:
        raise UserError("the servers in vllm.server_url have different weight-transfer engines",
                        where="vllm.server_url", valid="servers started alike (one --weight-transfer)",
                        hint="start every server with the same grpo vllm-serve flags")
    if asked and asked not in offered:
        raise UserError(f"the server's weight-transfer engine takes {offered[0]!r}, not {asked!r}",
                        where="GRPO_VLLM_WEIGHT_TRANSPORT", valid=", ".join(offered),
                        hint=f"unset GRPO_VLLM_WEIGHT_TRANSPORT, or restart the server with grpo vllm-serve "
                             f"--weight-transfer {'grpo_gloo' if asked == 'gloo' else asked}")
    return offered[0]


def _param_device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None


__all__ = ["VllmServerBackend", "choose_transport", "request_seeds"]
