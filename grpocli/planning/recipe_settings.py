"""A recipe in the memory model's terms (`Settings`) and the searches over it: the peak of a recipe, the largest
micro-batch that fits, a recipe with dotted keys changed. Below grpocli.planning.plan (the plan) and
grpocli.planning.autosize (the "auto" sizes), which both ask it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from grpocli.planning.memory import F32, Settings, Tokens, phases
from grpocli.planning.shapes import ModelShape, dtype_bytes
from grpocli.planning.teacher import teacher_shape, teacher_weight_bytes

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

#: Shared-prompt rows up to this many times the hidden size (grpocli.algorithms.packing.DENSE_ROW_FACTOR).
DENSE_ROW_FACTOR = 4
#: Completions per generate call of the 'hf' backend (grpocli.generation.hf.HFBackend's batch_size).
HF_BATCH = 64
#: The bound the search for the largest micro-batch stops at.
MAX_SEARCH = 4096


def settings_of(r: Recipe, shape: ModelShape, *, gpus: int, gpu_memory: int, sharding: str | None = None) -> Settings:
    """The memory model's settings for recipe `r` on `gpus` processes of `gpu_memory` bytes each
    (`sharding`: what the processes run, where accelerate's config decides: 'zero2', 'zero3', 'fsdp2')."""
    t, a, m = r.train, r.algorithm, r.model
    weight = dtype_bytes(m.dtype if m.dtype != "auto" else shape.config_dtype)
    compute = 2 if t.mixed_precision in ("bf16", "fp16") else weight
    sharding = (sharding or t.sharding) if gpus > 1 else "none"
    per_process = t.prompts_per_step * r.generation.num_generations // max(gpus, 1)
    micro = t.micro_batch_size if t.micro_batch_size != "auto" else per_process  # auto: make_plan sizes it
    train_rows = _rows(micro, t.max_tokens_per_micro_batch if t.max_tokens_per_micro_batch != "auto" else None, r,
                       per_process)
    logprob_rows = getattr(t, "logprob_micro_batch_size", None) or train_rows
    linears = [lin for lin in shape.layer_linears
               if m.lora.target_modules == "all-linear" or any(lin.name.endswith(x) for x in m.lora.target_modules)]
    backend = r.generation.backend
    share = r.vllm.gpu_memory_utilization if r.vllm.gpu_memory_utilization != "auto" else 0.0  # make_plan sizes it
    engine = int(share * gpu_memory) if backend == "vllm" else 0
    teacher = teacher_shape(r)  # [distill]'s teacher in process (None: none, or served)
    return Settings(
        weight_bytes=weight, compute_bytes=compute,
        lora_params=shape.lora_params(m.lora.r, m.lora.target_modules) if m.lora.enabled else 0,
        lora_rank=m.lora.r if m.lora.enabled else 0, lora_linears=len(linears) if m.lora.enabled else 0,
        gradient_checkpointing=m.gradient_checkpointing is True,  # "auto": make_plan decides first
        activation_offloading=bool(getattr(t, "activation_offloading", False)),
        reference=a.beta > 0 and a.reference != "server", processes=max(gpus, 1), sharding=sharding,
        teacher=teacher, teacher_bytes=teacher_weight_bytes(r, teacher) if teacher is not None else 0,
        micro_batches=math.ceil(per_process / train_rows) if per_process else 1,
        train=tokens_of(r, shape, train_rows), logprob=tokens_of(r, shape, min(logprob_rows, max(per_process, 1))),
        chunk_tokens=getattr(t, "logits_chunk_tokens", 1024), entropy_grad=a.entropy_coef > 0, engine_bytes=engine,
        engine_sleeps=int(getattr(r.vllm, "sleep_mode", 0)) > 0,
        generation_bytes=_hf_generation(r, shape, compute, per_process) if backend in ("hf", "paged") else 0,
    )


def _rows(micro_batch_size: int, max_tokens: int | None, r: Recipe, per_process: int) -> int:
    """Sequences in the largest micro-batch: micro_batch_size, or as many full-length ones as the token budget holds."""
    if max_tokens is not None:
        length = r.data.max_prompt_length + r.generation.max_completion_length
        return max(1, min(max_tokens // length, max(per_process, 1)))
    return max(1, min(micro_batch_size, max(per_process, 1)))


def tokens_of(r: Recipe, shape: ModelShape, n: int) -> Tokens:
    """The forward pass of n full-length sequences as grpocli.algorithms.packing lays them out (and, under
    train.sequence_parallel, as grpocli.parallel.sequence splits them)."""
    lp, lc, g = r.data.max_prompt_length, r.generation.max_completion_length, r.generation.num_generations
    attn = r.model.attn_implementation or "sdpa"
    split = sequence_parallel(r)
    if "flash" in attn:  # packed: one row, no mask
        return Tokens(rows=1, width=n * (lp + lc - 1), scored=n * lc, split=split)
    rows, width, scored = n, lp + lc - 1, n * lc  # padded rows: a 2D mask that transformers makes 4D, but
    mask = n * width * width if n > 1 else 0      # none for one row alone (no padding: is_causal instead)
    tree = False
    if attn in ("sdpa", "eager"):
        groups = max(len({i // g for i in range(k, k + n)}) for k in range(0, max(n, g), n))
        shared = groups * lp + n * (lc - 1)
        if shared <= DENSE_ROW_FACTOR * shape.hidden_size:  # shared prompts: one row, its tree mask
            rows, width, mask, tree = 1, shared, shared * shared, True
        if split > 1:  # the whole (padded) rows' mask on every process of the split (grpocli.parallel.sequence's
            whole = -(-width // split) * split  # whole_mask), but none for right-padded rows under sdpa (is_causal)
            mask = rows * whole * whole if tree or attn == "eager" else 0
    return Tokens(rows=rows, width=width, scored=scored, mask=mask, split=split)


def sequence_parallel(r: Recipe) -> int:
    """train.sequence_parallel (1 where the recipe has no such key)."""
    return int(getattr(r.train, "sequence_parallel", 1) or 1)


def _hf_generation(r: Recipe, shape: ModelShape, compute: int, per_process: int) -> int:
    """transformers' generate, HF_BATCH completions a call (whole groups, at least one), or, for
    'paged', every completion of the generation batch at once (its cache is sized to hold them all,
    grpocli.generation.paged): the KV cache and one step's float32 logits."""
    length = r.data.max_prompt_length + r.generation.max_completion_length
    g = r.generation.num_generations
    every = per_process * r.train.steps_per_generation
    batch = every if r.generation.backend == "paged" else min(max(1, HF_BATCH // g) * g, every)
    kv = batch * length * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * compute
    return kv + batch * shape.vocab_size * F32


def peak_of(r: Recipe, shape: ModelShape, gpus: int, gpu_memory: int, sharding: str | None = None,
            *, training_only: bool = False) -> int:
    """The largest phase's bytes per process (`training_only`: of the log-prob and training phases)."""
    s = settings_of(r, shape, gpus=gpus, gpu_memory=gpu_memory, sharding=sharding)
    return max(p.total for p in phases(shape, s)[1 if training_only else 0:])


def largest_micro_batch(r: Recipe, shape: ModelShape, gpus: int, gpu_memory: int, sharding: str | None) -> int:
    """The largest train.micro_batch_size (no token budget) whose log-prob and training phases fit; 0 when
    1 does not."""
    per_process = max(1, r.train.prompts_per_step * r.generation.num_generations // max(gpus, 1))

    def fits(n: int) -> bool:
        return peak_of(with_changes(r, {"train.micro_batch_size": n, "train.max_tokens_per_micro_batch": None}),
                       shape, gpus, gpu_memory, sharding, training_only=True) <= gpu_memory

    if not fits(1):
        return 0
    lo, hi = 1, min(per_process, MAX_SEARCH)
    while lo < hi:  # the peak grows with the micro-batch
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def with_changes(r: Recipe, changes: dict[str, Any]) -> Recipe:
    """A copy of `r` with dotted keys changed (no validation beyond the types: the values are the plan's own)."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    update = {}
    for section, values in sections.items():
        current = getattr(r, section)
        nested = {k: v for k, v in values.items() if "." not in k}
        for k, v in values.items():
            if "." in k:
                sub, _, leaf = k.partition(".")
                nested[sub] = getattr(current, sub).model_copy(update={leaf: v})
        update[section] = current.model_copy(update=nested)
    return r.model_copy(update=update)


__all__ = ["largest_micro_batch", "peak_of", "settings_of", "tokens_of", "with_changes"]
