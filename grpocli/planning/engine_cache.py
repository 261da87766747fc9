"""The colocated vLLM engine's KV cache (generation.backend = "vllm"): the sequences it holds at once,
their cache at full length, and what its memory share leaves for it.

What the engine holds at once, per process, depends on how generation runs beside training:

    sync (async_steps = 0)   one generation batch: prompts_per_step x steps_per_generation groups of G
    async_steps = k          the same (the worker generates one batch at a time, k ahead)
    pipeline "inflight"      (L + 1) batches, L = max_staleness // cycle (at least 1): the groups carried
                             over from earlier cycles and the new ones (grpocli.trainer.pipeline)

Each sequence's cache at full length is (data.max_prompt_length + generation.max_completion_length)
tokens x 2 (keys and values) x layers x key-value heads x head size, in the engine's dtype (bfloat16
on a GPU: grpocli.generation.engine_options.engine_dtype). The engine's share
(vllm.gpu_memory_utilization of the device) holds its weights, then the cache. Where the cache is too
small vLLM does not fail: it preempts sequences and computes them again later, which costs time, not
memory; the plan says so rather than counting it against the fit.

A LoRA policy whose syncs send the adapters alone (vllm.lora_sync = "adapter") also has the engine hold
LoRA buffers of one adapter at vLLM's max_lora_rank (r rounded up to 8, 16, 32, ...) in its dtype:
r x (in + out) per adapted linear layer; a sync then sends the adapters (in the policy's dtype), not the
whole model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpocli.planning.shapes import ModelShape

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

#: The engine's dtype on a GPU (bfloat16 weights and cache), bytes per element.
ENGINE_BYTES = 2


@dataclass(frozen=True)
class EngineCache:
    sequences: int      # held at once by one process's engine
    batches: int        # generation batches they make
    needed: int         # bytes of their KV cache at full length
    available: int      # bytes of the engine's share left after its weights (and LoRA buffers)
    lora: int = 0       # bytes of the engine's LoRA buffers (vllm.lora_sync = "adapter")
    sync: int = 0       # bytes a weight sync sends: the adapters alone, or the whole model
    merged: int = 0     # bytes a merged sync would send (the whole model, in the engine's dtype)

    @property
    def fits(self) -> bool:
        return self.needed <= self.available

    def text(self, gib) -> str:  # gib: grpocli.planning.plan.gib
        held = f"{self.sequences} sequences at once ({self.batches} generation batch(es)"
        held += ", in flight)" if self.batches > 1 else ")"
        line = (f"vLLM engine's KV cache: {held} need {gib(self.needed)} at full length; its share leaves "
                f"{gib(self.available)} after its weights")
        if not self.fits:
            line += " (vLLM will preempt and recompute what does not fit: slower, not out of memory)"
        if self.lora:
            line += (f"\nvLLM engine's LoRA buffers: {gib(self.lora)}; a weight sync sends the adapters alone, "
                     f"{gib(self.sync)} (merged: {gib(self.merged)})")
        return line


def inflight_batches(r: Recipe) -> int:
    """Generation batches the engine holds at once: L + 1 in flight, else 1."""
    g = r.generation
    if g.pipeline != "inflight":
        return 1
    cycle = r.train.steps_per_generation * r.algorithm.num_iterations
    return max((g.max_staleness or cycle) // cycle, 1) + 1


def adapter_sync(r: Recipe, gpus: int) -> bool:
    """Whether a LoRA policy's syncs send the adapters alone (grpocli.generation.lora_adapter: vllm.lora_sync
    "adapter", or "auto" on the GPUs a plan is for; one process, no sharding, not in flight, no sleep mode),
    as far as the recipe says."""
    m, v, t = r.model, r.vllm, r.train
    return (m.lora.enabled and v.lora_sync in ("adapter", "auto") and r.generation.pipeline != "inflight"
            and max(gpus, t.num_processes) == 1 and t.sharding == "none" and v.sleep_mode == 0)


def engine_cache(r: Recipe, shape: ModelShape, *, gpus: int, gpu_memory: int) -> EngineCache | None:
    """The colocated engine's cache of recipe `r` (None for other backends); with adapter syncs, its LoRA
    buffers (one adapter of vLLM's max_lora_rank, r rounded up) and what a sync sends."""
    from grpocli.generation.lora_adapter import VLLM_RANKS

    if r.generation.backend != "vllm":
        return None
    t, g, m = r.train, r.generation, r.model
    batches = inflight_batches(r)
    sequences = batches * t.prompts_per_step * t.steps_per_generation * g.num_generations // max(gpus, 1)
    length = r.data.max_prompt_length + g.max_completion_length
    per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * ENGINE_BYTES
    share = int(r.vllm.gpu_memory_utilization * gpu_memory)
    merged = shape.params * ENGINE_BYTES
    lora = sync = 0
    if adapter_sync(r, gpus):
        rank = next((x for x in VLLM_RANKS if x >= m.lora.r), VLLM_RANKS[-1])
        lora = shape.lora_params(rank, m.lora.target_modules) * ENGINE_BYTES
        sync = shape.lora_params(m.lora.r, m.lora.target_modules) * _trainer_bytes(m.dtype, shape)
    return EngineCache(sequences=sequences, batches=batches, needed=sequences * length * per_token,
                       available=max(share - merged - lora, 0), lora=lora, sync=sync or merged, merged=merged)


def _trainer_bytes(dtype: str, shape: ModelShape) -> int:
    """Bytes per element of the policy's adapters as peft saves them (the model's dtype)."""
    name = shape.config_dtype if dtype == "auto" else dtype
    return 4 if name in ("float32", None) else 2


__all__ = ["EngineCache", "adapter_sync", "engine_cache", "inflight_batches"]
