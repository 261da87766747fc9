"""What the "auto" sizes of a recipe become on a device of a given memory: the one rule that `grpo train`
(grpocli.trainer.autofit, before the model loads) and `grpo plan` (which plans what train would run) share.

* model.gradient_checkpointing = "auto": off when, without it, a micro-batch of
  min(4, the completions a process trains on) (or the recipe's own micro_batch_size) still fits; on
  otherwise. Recomputing the activations costs about a third more training time (TRL's AsyncGRPO blog
  turned it off by hand for its speed-up), so it is on only where memory needs it.
* train.micro_batch_size = "auto": the largest micro-batch whose log-prob and training phases fit.
* train.max_tokens_per_micro_batch = "auto": that micro-batch's worth of full-length sequences
  (data.max_prompt_length + generation.max_completion_length each).
* vllm.gpu_memory_utilization = "auto" (a colocated engine): first the least share that holds the engine's
  weights and one generation batch's KV cache (the trainer's sizes are chosen beside it), then the largest,
  in steps of 0.01 up to MAX_AUTO_SHARE, with which every phase still fits. Without a colocated engine: 0.3.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from grpocli.planning.engine_cache import engine_cache
from grpocli.planning.memory import phases
from grpocli.planning.recipe_settings import largest_micro_batch, settings_of
from grpocli.planning.recipe_settings import with_changes as _with
from grpocli.recipe.vllm_section import MAX_AUTO_SHARE

if TYPE_CHECKING:
    from grpocli.planning.shapes import ModelShape
    from grpocli.recipe.schema import Recipe

#: The micro-batch that gradient checkpointing "auto" still wants without recomputation.
SMALLEST_WORTH_IT = 4
AUTO_KEYS = ("model.gradient_checkpointing", "train.micro_batch_size", "train.max_tokens_per_micro_batch",
             "vllm.gpu_memory_utilization")
SHARE = "vllm.gpu_memory_utilization"
#: What the engine's share is where "auto" has no engine to size (the key's default).
DEFAULT_SHARE = 0.3


def auto_keys(r: Recipe) -> list[str]:
    """The keys of `r` set to "auto"."""
    return [k for k in AUTO_KEYS if getattr(getattr(r, k.split(".")[0]), k.split(".")[1]) == "auto"]


def auto_sizes(r: Recipe, shape: ModelShape, gpus: int, memory: int, sharding: str | None = None) -> dict[str, Any]:
    """The values of `r`'s "auto" keys for `gpus` processes of `memory` bytes each (a size of 0: nothing fits)."""
    keys, out = auto_keys(r), {}
    if not keys:
        return out
    per_process = max(1, r.train.prompts_per_step * r.generation.num_generations // max(gpus, 1))
    wanted = r.train.micro_batch_size if isinstance(r.train.micro_batch_size, int) else min(SMALLEST_WORTH_IT,
                                                                                                per_process)
    sizing = _with(r, {k: v for k, v in (("train.micro_batch_size", 1), ("train.max_tokens_per_micro_batch", None))
                       if k in keys})
    if SHARE in keys:
        out[SHARE] = _least_share(r, shape, gpus, memory) if r.generation.backend == "vllm" else DEFAULT_SHARE
        sizing = _with(sizing, out)
    if "model.gradient_checkpointing" in keys:
        off = largest_micro_batch(_with(sizing, {"model.gradient_checkpointing": False}), shape, gpus, memory, sharding)
        out["model.gradient_checkpointing"] = off < wanted
        sizing = _with(sizing, out)
    if "train.micro_batch_size" in keys or "train.max_tokens_per_micro_batch" in keys:
        largest = largest_micro_batch(sizing, shape, gpus, memory, sharding)
        if "train.micro_batch_size" in keys:
            out["train.micro_batch_size"] = largest
        if "train.max_tokens_per_micro_batch" in keys:
            length = r.data.max_prompt_length + r.generation.max_completion_length
            out["train.max_tokens_per_micro_batch"] = max(16, largest * length) if largest else 0
    if SHARE in keys and r.generation.backend == "vllm":
        out[SHARE] = _largest_share(_with(r, {k: max(v, 1) if type(v) is int else v for k, v in out.items()}),
                                    shape, gpus, memory, sharding, out[SHARE])
    return out


def _least_share(r: Recipe, shape: ModelShape, gpus: int, memory: int) -> float:
    """The share that holds the engine's weights (and LoRA buffers) and one generation batch's KV cache."""
    cache = engine_cache(_with(r, {SHARE: 1.0}), shape, gpus=gpus, gpu_memory=memory)
    need = (cache.merged + cache.lora + cache.needed) / memory if cache is not None and memory else 0.0
    return min(max(math.ceil(need * 100) / 100, 0.01), MAX_AUTO_SHARE)


def _largest_share(r: Recipe, shape: ModelShape, gpus: int, memory: int, sharding: str | None, least: float) -> float:
    """The largest share from `least` up, in steps of 0.01, with which every phase fits (`least` if none does)."""
    def fits(hundredths: int) -> bool:
        s = settings_of(_with(r, {SHARE: hundredths / 100}), shape, gpus=gpus, gpu_memory=memory, sharding=sharding)
        return max(p.total for p in phases(shape, s)) <= memory

    lo, hi = round(least * 100), round(MAX_AUTO_SHARE * 100)
    if not fits(lo):
        return least
    while lo < hi:  # the peak grows with the share
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo / 100


__all__ = ["AUTO_KEYS", "auto_keys", "auto_sizes"]
