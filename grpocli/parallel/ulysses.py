"""Ulysses attention: each process holds 1/N of a row's tokens; attention sees the whole row.

DeepSpeed-Ulysses (Jacobs et al. 2023), as verl's `ulysses_sequence_parallel_size` and
ALST/Arctic's `UlyssesSPAttentionHF`: every layer but attention works token by token, so the N
processes of a split each run it on their 1/N of the row. Around attention, one all-to-all turns
`q, k, v [B, H, W/N, D]` (all heads, a slice of the tokens) into `[B, H/N, W, D]` (1/N of the
heads, every token); the model's own attention function runs on that, under the whole row's mask;
a second all-to-all turns its output back: two per layer forward, two backward (and the forward's
again where gradient checkpointing recomputes a layer). Both are differentiable (their backward is the
opposite exchange), so gradient checkpointing's recomputation exchanges again, in the same order
on every process.

The wrapper is registered in transformers' attention table under `grpo_ulysses_<inner>` and the
model's `_attn_implementation` is set to it (`use_ulysses`); it wraps whichever attention the model
used (sdpa, eager, flash-attention). Outside a split pass (generation, evaluation) it calls the
inner function unchanged: a pass asks for the exchange by handing the model a `sequence_split`
keyword (a `SplitAttention`), which transformers passes down to every attention call.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from grpocli.errors import UserError

PREFIX = "grpo_ulysses_"
#: Model families whose attention layers call transformers' attention table with `[B, H, T, D]`
#: q/k/v and nothing position-dependent besides rotary (tests/parallel/test_sequence_parallel.py runs
#: the first three; mistral is llama's code). Others are refused, by name.
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class SplitAttention:
    """What attention needs to see the whole row from a process's slice of it."""

    group: Any                          # the split's process group
    size: int                           # N
    mask: torch.Tensor | None           # the whole row's [r, 1, W, W] mask (sdpa: bool, eager: additive);
                                        # None under flash-attention (`varlen` says where sequences start)
    varlen: dict[str, Any] = field(default_factory=dict)  # flash-attention's cu_seq_lens / max_length of the row


class _AllToAll(torch.autograd.Function):
    """Split `x` into N chunks along `scatter`, send chunk j to process j, concatenate what comes
    back along `gather` (in process order); backward is the opposite exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int, scatter: int, gather: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.dims = group, size, (scatter, gather)
        return exchange(x, group, size, scatter, gather)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        scatter, gather = ctx.dims
        return exchange(grad, ctx.group, ctx.size, gather, scatter), None, None, None, None


def exchange(x: torch.Tensor, group: Any, size: int, scatter: int, gather: int) -> torch.Tensor:
    """One all-to-all (torch's all_to_all_single: gloo and NCCL both have it): `x` cut along `scatter`."""
    import torch.distributed as dist

    send = torch.stack(x.chunk(size, dim=scatter)).contiguous()  # [N, ...] chunk j for process j
    received = torch.empty_like(send)                             # [N, ...] from process j
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather)


def heads_to_tokens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    split: SplitAttention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q `[B, H, W/N, D]`, k and v `[B, Hkv, W/N, D]` (this process's tokens, every head) -> `[B, H/N, W, D]`
    and `[B, Hkv/N, W, D]` (every token, its heads), in one all-to-all."""
    n = split.size
    parts = [x.unflatten(1, (n, x.shape[1] // n)) for x in (q, k, v)]      # [B, N, h, W/N, D] each
    sizes = [x.shape[2] for x in parts]
    joined = _AllToAll.apply(torch.cat(parts, dim=2), split.group, n, 1, 3)  # [B, 1, h_q+2h_kv, W, D]
    return tuple(joined.squeeze(1).split(sizes, dim=1))                     # [B, h, W, D] each


def tokens_to_heads(x: torch.Tensor, split: SplitAttention) -> torch.Tensor:
    """Attention's output `[B, W, H/N, D]` -> `[B, W/N, H, D]` (this process's tokens, every head)."""
    return _AllToAll.apply(x, split.group, split.size, 1, 2)


def inner_function(name: str, module: Any) -> Any:
    """The attention function `name` names for `module`'s layer: transformers' table, or (eager) the
    eager function of the module's own modeling file."""
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[name]


def _wrapper(inner: str) -> Any:
    def ulysses_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, *args: Any,
                          sequence_split: SplitAttention | None = None, **kwargs: Any) -> tuple[Any, Any]:
        fn = inner_function(inner, module)
        if sequence_split is None:  # generation, evaluation: the model's own attention
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        split = sequence_split
        q, k, v = heads_to_tokens(query, key, value, split)  # [B, H/N, W, D], k and v [B, Hkv/N, W, D]
        for name in ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            kwargs.pop(name, None)  # this slice's; the whole row's come from the split
        out, _ = fn(module, q, k, v, split.mask, *args, **{**kwargs, **split.varlen})  # [B, W, H/N, D]
        return tokens_to_heads(out.contiguous(), split), None                       # [B, W/N, H, D]

    ulysses_attention.__name__ = f"ulysses_{inner}"
    return ulysses_attention


def inner_name(name: str | None) -> str | None:
    """The attention a model runs under the wrapper (its own name where there is none)."""
    return name[len(PREFIX):] if name is not None and name.startswith(PREFIX) else name


def check_model(model: Any, size: int) -> None:
    """UserError unless a split over `size` processes can run this model: a family whose attention
    the wrapper covers, no sliding window, attention and key-value heads divisible by `size`."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    family = getattr(text, "model_type", None)
    hint = "set train.sequence_parallel = 1, or train a model of a covered family"
    if family not in FAMILIES:
        raise UserError(f"train.sequence_parallel = {size}: the model's family {family!r} is not covered by grpo's "
                        f"Ulysses attention (covered: {', '.join(FAMILIES)})", hint=hint)
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
    if window:
        raise UserError(f"train.sequence_parallel = {size}: the model's attention uses a sliding window "
                        f"({window} tokens), which the split's whole-row mask does not apply", hint=hint)
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads % size or kv % size:
        fits = [n for n in range(2, kv + 1) if heads % n == 0 and kv % n == 0]
        raise UserError(f"train.sequence_parallel = {size} does not divide the model's heads ({heads} attention, "
                        f"{kv} key-value): each process takes 1/{size} of each",
                        hint=f"valid: {', '.join(map(str, fits)) or 'none above 1'}")


def use_ulysses(model: Any) -> None:
    """Route `model`'s attention through the wrapper (registered once per inner implementation);
    without a `sequence_split` keyword its forward is unchanged."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    model = getattr(model, "module", model)
    config = model.config
    current = getattr(config, "_attn_implementation", None) or "eager"
    if current.startswith(PREFIX):
        return
    name = PREFIX + current
    AttentionInterface.register(name, _wrapper(current))
    mask_of = "sdpa" if current not in ALL_MASK_ATTENTION_FUNCTIONS else current
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_of])
    for sub in {id(c): c for c in (config, *_sub_configs(config))}.values():
        if getattr(sub, "_attn_implementation", None) == current:
            sub._attn_implementation = name


def _sub_configs(config: Any) -> list[Any]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    return [text] if text is not None and text is not config else []
