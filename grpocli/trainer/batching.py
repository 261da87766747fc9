"""Micro-batches: the sequences that enter the loss, padded into rows of at most a token budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpocli.trainer.rollouts import Rollouts


@dataclass
class MicroBatch:
    """Right-padded prompt+completion rows; masks are over the predicted tokens ([:, 1:])."""

    input_ids: torch.Tensor        # [b, L]
    attention_mask: torch.Tensor   # [b, L]
    loss_mask: torch.Tensor        # [b, L-1] 1.0 on completion tokens that enter the loss
    advantages: torch.Tensor       # [b]
    index: torch.Tensor            # [b] rows of the Rollouts they came from
    old_logp: torch.Tensor | None = None     # [b, L-1]
    ref_logp: torch.Tensor | None = None     # [b, L-1]

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


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
    pad_id: int,
    max_sequences: int,
    max_tokens: int | None = None,
) -> list[MicroBatch]:
    """Group `indices` into micro-batches of at most `max_sequences` rows, or (with
    `max_tokens`) of at most `max_tokens` padded tokens, sorted by length to waste little padding."""
    lengths = {i: len(rollouts.prompt_ids[i // rollouts.group_size]) + len(rollouts.completion_ids[i]) for i in indices}
    order = sorted(indices, key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups:
            cur = groups[-1]
            width = max(lengths[j] for j in cur + [i])
            fits = len(cur) < max_sequences if max_tokens is None else width * (len(cur) + 1) <= max_tokens
            if fits:
                cur.append(i)
                continue
        groups.append([i])
    return [_pad(rollouts, g, pad_id) for g in groups]


def _pad(rollouts: Rollouts, rows: list[int], pad_id: int) -> MicroBatch:
    g = rollouts.group_size
    seqs = [(rollouts.prompt_ids[i // g], rollouts.completion_ids[i]) for i in rows]
    width = max(len(p) + len(c) for p, c in seqs)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [b, L]
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # [b, L]
    loss_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)  # [b, L-1]
    for r, (p, c) in enumerate(seqs):
        input_ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        attention[r, : len(p) + len(c)] = 1
        loss_mask[r, len(p) - 1 : len(p) + len(c) - 1] = 1.0  # logits at t-1 score token t
    index = torch.tensor(rows, dtype=torch.long)
    return MicroBatch(input_ids, attention, loss_mask, rollouts.advantages[index].float(), index)
