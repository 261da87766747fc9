"""Sequence parallelism (train.sequence_parallel = N): N processes split each micro-batch's rows.

The processes are cut into splits of N consecutive ranks. Every process keeps its own prompts,
rollouts and micro-batches (data parallelism is unchanged: the batch arithmetic, the normalisers
and the gradient reduction are the unsplit run's). The N processes of a split take turns: for each
micro-batch slot, each process's micro-batch is run by all N of them, each holding 1/N of its rows'
tokens (`Shard`) through every layer; attention sees the whole row for 1/N of the heads
(grpocli.parallel.ulysses). Each process computes the log-probs of the scored tokens in its slice;
they are gathered so that every process holds the micro-batch's whole `[n, T]` log-probs, and only
its owner turns them into a loss (the others backward 0 x them: the same collectives run, in the
same order, and the gradient of the gather sums into the owner's). So the gradient a process
computes for its slice of another's tokens adds up, over the split, to the unsplit gradient.

Memory per process is that of a micro-batch N times shorter (activations, logits), plus attention's
whole-width q/k/v for 1/N of the heads; time is the same work, exchanged twice per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpocli.algorithms.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    differentiable_entropy,
    token_entropy,
    token_logprobs,
)
from grpocli.algorithms.packing import Rows, attention_implementation, eager_mask, tree_mask
from grpocli.parallel.ulysses import SplitAttention

#: What the model is handed as its attention mask in a split pass: transformers passes a 4D mask to the
#: attention functions as it is, instead of building one for the slice (from its positions: a packed
#: slice's block mask) that the Ulysses wrapper would not use; the wrapper takes the whole row's.
UNUSED_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)


@dataclass(frozen=True)
class Shard:
    """One process's slice of a micro-batch's rows, and where its scored tokens go in the whole."""

    input_ids: torch.Tensor     # [r, W/N] this process's tokens (the row padded to a multiple of N)
    position_ids: torch.Tensor  # [r, W/N]
    keep: torch.Tensor          # [k] positions of the slice whose logits score a token (logits_to_keep)
    labels: torch.Tensor        # [r, k] the token each scores
    counts: tuple[int, ...]     # [N] scored positions per process
    inverse: torch.Tensor       # [K] the gathered (process-ordered) scored tokens back in `logit_index` order


def padded_width(w: int, size: int) -> int:
    """A row's width rounded up to a multiple of the split's `size` (each process holds width/size tokens)."""
    return -(-w // size) * size


def shard_rows(rows: Rows, size: int, rank: int) -> Shard:
    """Process `rank`'s contiguous 1/`size` of `rows` (padded at the end: pad tokens at positions
    0, 1, ... that the whole-row mask keeps to themselves)."""
    r, w = rows.input_ids.shape
    width = padded_width(w, size)
    pad = width - w
    ids = torch.cat([rows.input_ids, rows.input_ids.new_zeros(r, pad)], dim=1)                      # [r, W']
    positions = torch.cat([rows.position_ids, torch.arange(pad).expand(r, pad).to(rows.position_ids)], dim=1)
    part = width // size
    owner = rows.logit_index // part                                                                 # [K]
    order = torch.cat([torch.nonzero(owner == j).flatten() for j in range(size)])                   # [K]
    mine = torch.nonzero(owner == rank).flatten()
    return Shard(
        input_ids=ids[:, rank * part:(rank + 1) * part], position_ids=positions[:, rank * part:(rank + 1) * part],
        keep=rows.logit_index[mine] - rank * part, labels=rows.labels[:, mine],
        counts=tuple(int((owner == j).sum()) for j in range(size)), inverse=torch.argsort(order),
    )


def whole_mask(rows: Rows, size: int, model: Any, device: torch.device) -> torch.Tensor | None:
    """The mask of the whole (padded) row for attention over every token: `[r, 1, W', W']`, bool
    for sdpa, additive for eager; None where causal attention is the mask (sdpa: right-padded rows, a
    row of one sequence) and under flash-attention (`varlen` says where sequences start)."""
    r, w = rows.input_ids.shape
    width = padded_width(w, size)
    attention = attention_implementation(model) or ""
    if "flash" in attention:
        return None
    one_causal = rows.attention_mask is not None or (rows.tree is None and int((rows.position_ids[0] == 0).sum()) == 1)
    if one_causal and attention == "sdpa":  # right-padded rows, one packed sequence: causal attention needs no
        return None                         # mask (a real token never sees a later pad); sdpa runs is_causal
    pad = width - w
    if rows.tree is not None:  # shared prompts: the tree mask, each pad token a segment of its own
        segment = torch.cat([rows.tree[0], -2 - torch.arange(pad)]).to(device)
        branch = torch.cat([rows.tree[1], torch.full((pad,), -1)]).to(device)
        mask = tree_mask(segment, branch)                                       # [1, 1, W', W']
    elif rows.attention_mask is None:  # packed: one segment per sequence (positions restart at 0)
        positions = torch.cat([rows.position_ids[0], torch.arange(pad)]).to(device)
        segment = torch.cumsum(positions == 0, dim=0)
        segment[w:] = -2 - torch.arange(pad, device=device)
        mask = tree_mask(segment, torch.full_like(segment, -1))                 # [1, 1, W', W']
    else:  # padded rows: causal over each row's real tokens
        real = torch.cat([rows.attention_mask, rows.attention_mask.new_zeros(r, pad)], dim=1).to(device) > 0
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril_()
        mask = (causal[None] & real[:, None, :])[:, None]                       # [r, 1, W', W']
        mask = mask | torch.eye(width, dtype=torch.bool, device=device)         # a pad query sees itself
    return eager_mask(model, mask)


def whole_varlen(rows: Rows, size: int, device: torch.device) -> dict[str, Any]:
    """flash-attention's boundaries of the whole packed row, the padding one more sequence."""
    if rows.cu_seqlens is None:
        return {}
    w = rows.input_ids.shape[1]
    pad = padded_width(w, size) - w
    cu = rows.cu_seqlens.tolist() + ([w + pad] if pad else [])
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    longest = max(rows.max_seqlen, pad)
    return {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t, "max_length_q": longest, "max_length_k": longest}


class _GatherScored(torch.autograd.Function):
    """Every process's `[r, k_j]` values, concatenated in process order: `[r, K]`. Backward sums the
    gradient over the split (only the owner's loss is not 0) and keeps this process's columns."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, counts: tuple[int, ...], rank: int) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group, ctx.counts, ctx.rank = group, counts, rank
        most = max(counts)
        padded = torch.nn.functional.pad(local, (0, most - local.shape[1])).contiguous()  # [r, most]
        every = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(every, padded, group=group)
        return torch.cat([part[:, :k] for part, k in zip(every, counts)], dim=1)          # [r, K]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        start = sum(ctx.counts[: ctx.rank])
        return grad[:, start:start + ctx.counts[ctx.rank]], None, None, None


class SequenceSplit:
    """This process's split: its group of N processes, and the sharded log-prob pass."""

    def __init__(self, size: int, rank: int, world: int) -> None:
        import torch.distributed as dist

        self.size, self.rank = size, rank % size
        self.group = None
        for first in range(0, world, size):  # every process creates every group, in the same order
            group = dist.new_group(list(range(first, first + size)))
            if first <= rank < first + size:
                self.group = group

    def exchange(self, item: Any) -> list[Any]:
        """Every process's `item` of this split, in process order (all_gather_object in the split)."""
        import torch.distributed as dist

        every: list[Any] = [None] * self.size
        dist.all_gather_object(every, item, group=self.group)
        return every

    def gather(self, local: torch.Tensor, shard: Shard) -> torch.Tensor:
        """The split's scored values `[r, k_j]` as the whole micro-batch's `[r, K]`, in `logit_index` order."""
        gathered = _GatherScored.apply(local, self.group, shard.counts, self.rank)  # [r, K] process order
        return gathered[:, shard.inverse.to(gathered.device)]

    def logprobs(self, model: Any, rows: Rows, temperature: float, *, with_entropy: bool = False,
                 entropy_grad: bool = False, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """grpocli.algorithms.logprobs.sequence_logprobs of the whole `rows`, from this process's slice."""
        device = next(model.parameters()).device
        shard = shard_rows(rows, self.size, self.rank)
        split = SplitAttention(self.group, self.size, whole_mask(rows, self.size, model, device),
                               whole_varlen(rows, self.size, device))
        logits = model(
            input_ids=shard.input_ids.to(device), position_ids=shard.position_ids.to(device),
            attention_mask=UNUSED_MASK.to(device),  # a 4D mask is passed as it is: no mask of the slice is built
            logits_to_keep=shard.keep.to(device), use_cache=False, sequence_split=split,
        ).logits                                                       # [r, k, V] this slice's scored positions
        labels = shard.labels.to(device)
        local = token_logprobs(logits, labels, temperature, chunk_tokens)                  # [r, k]
        index = rows.token_index.to(device)                            # [n, T] into the r*K scored tokens
        real = rows.loss_mask.to(device) > 0                           # [n, T]
        logp = self.gather(local, shard).flatten()[index].masked_fill(~real, 0.0)          # [n, T]
        entropy = None
        if with_entropy:
            if entropy_grad:
                local_entropy = differentiable_entropy(logits, temperature)
            else:
                local_entropy = token_entropy(logits, temperature, chunk_tokens)
            entropy = self.gather(local_entropy, shard).flatten()[index].masked_fill(~real, 0.0)  # [n, T]
        return logp, entropy

    @staticmethod
    def tie(loss: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
        """`loss` plus 0 x every gathered output with a gradient, so that every process of the split
        runs the gathers' backward (collectives) whatever its loss reads."""
        zero = logp.sum() * 0.0
        if entropy is not None and entropy.requires_grad:
            zero = zero + entropy.sum() * 0.0
        return loss + zero
