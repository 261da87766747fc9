"""Micro-batches: the sequences that enter the loss, in rows laid out by grpocli.trainer.packing.

A micro-batch holds at most `max_sequences` sequences or, with a token budget (verl's
`use_dynamic_bsz` / `ppo_max_token_len_per_gpu`), sequences of at most `max_tokens` tokens
together (prompt + completion each, whatever the layout then saves); a sequence longer than the
budget gets a micro-batch of its own. Sequences stay in rollout order, so the completions of a
group sit next to each other and can share their prompt. The loss does not depend on the split:
every aggregation divides by whole-batch counts (LossNorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpocli.trainer.packing import Layout, Sequence, build_rows
from grpocli.trainer.rollouts import Rollouts


@dataclass
class MicroBatch:
    """The rows of n sequences; per-sequence tensors are over completion tokens `[n, T]`."""

    input_ids: torch.Tensor               # [r, W]
    position_ids: torch.Tensor            # [r, W]
    attention_mask: torch.Tensor | None   # [r, W] padded, [1, 1, W, W] shared prompts, None packed
    logit_index: torch.Tensor             # [K] row positions whose logits score a completion token
    labels: torch.Tensor                  # [r, K]
    token_index: torch.Tensor             # [n, T] index into labels.flatten() of each completion token
    loss_mask: torch.Tensor               # [n, T] 1.0 on completion tokens that enter the loss
    advantages: torch.Tensor              # [n]
    index: torch.Tensor                   # [n] rows of the Rollouts they came from
    sequence_tokens: int = 0              # prompt + completion tokens of the n sequences, unpacked
    old_logp: torch.Tensor | None = None  # [n, T]
    ref_logp: torch.Tensor | None = None  # [n, T]
    is_weight: torch.Tensor | None = None  # [n, T] truncated importance weight (engine -> trainer)

    @property
    def num_tokens(self) -> int:
        """Completion tokens that enter the loss."""
        return int(self.loss_mask.sum().item())

    @property
    def num_sequences(self) -> int:
        return self.loss_mask.shape[0]

    @property
    def row_tokens(self) -> int:
        """Token slots the forward pass computes (padding included, shared prompts once)."""
        return self.input_ids.numel()


def select_sequences(rollouts: Rollouts, mask_truncated: bool) -> list[int]:
    """Rows that enter forward and backward: kept groups, non-zero advantage, not masked."""
    keep = rollouts.keep.clone()  # [B*G]
    if mask_truncated:
        keep &= ~rollouts.truncated
    keep &= rollouts.advantages != 0
    return [int(i) for i in torch.nonzero(keep).flatten()]


def make_micro_batches(
    rollouts: Rollouts,
    indices: list[int],
    *,
    max_sequences: int,
    max_tokens: int | None = None,
    layout: Layout = Layout(),
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Group `indices` (in order) into micro-batches of at most `max_sequences` sequences, or
    (with `max_tokens`) of at most `max_tokens` sequence tokens, each laid out as `layout` says
    (`packing.choose_layout(model)`; padded rows by default; `pad_id` fills them, masked).
    """
    g = rollouts.group_size
    seqs = {i: (i // g, rollouts.prompt_ids[i // g], rollouts.completion_ids[i]) for i in indices}
    batches: list[list[int]] = []
    tokens = 0  # sequence tokens of the last micro-batch
    for i in indices:
        cost = len(seqs[i][1]) + len(seqs[i][2])
        fits = bool(batches) and (
            len(batches[-1]) < max_sequences if max_tokens is None else tokens + cost <= max_tokens
        )
        if not fits:
            batches.append([])
            tokens = 0
        batches[-1].append(i)
        tokens += cost
    return [_micro_batch(rollouts, [seqs[i] for i in rows], rows, layout, pad_id) for rows in batches]


def _micro_batch(rollouts: Rollouts, seqs: list[Sequence], rows: list[int], layout: Layout,
                 pad_id: int) -> MicroBatch:
    laid = build_rows(seqs, layout, pad_id)
    index = torch.tensor(rows, dtype=torch.long)
    return MicroBatch(
        input_ids=laid.input_ids, position_ids=laid.position_ids, attention_mask=laid.attention_mask,
        logit_index=laid.logit_index, labels=laid.labels, token_index=laid.token_index,
        loss_mask=laid.loss_mask, advantages=rollouts.advantages[index].float(), index=index,
        sequence_tokens=sum(len(p) + len(c) for _, p, c in seqs),
    )
