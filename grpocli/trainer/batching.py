"""Micro-batches: the sequences that enter the loss, in rows laid out by grpocli.algorithms.packing.

A micro-batch holds at most `max_sequences` sequences or, with a token budget (verl's
`use_dynamic_bsz` / `ppo_max_token_len_per_gpu`), sequences of at most `max_tokens` tokens
together (prompt + completion each, whatever the layout then saves); a sequence longer than the
budget gets a micro-batch of its own. Sequences stay in rollout order, so the completions of a
group sit next to each other and can share their prompt. The loss does not depend on the split:
every aggregation divides by whole-batch counts (LossNorm).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import torch

from grpocli.algorithms.packing import Layout, Rows, Sequence, build_rows
from grpocli.parallel import Parallel
from grpocli.trainer.rollouts import Advantages, Rollouts, Scored

if TYPE_CHECKING:
    from grpocli.recipe.algorithm_section import AlgorithmSection
    from grpocli.recipe.schema import TrainSection


@dataclass(frozen=True, kw_only=True)
class MicroBatch(Rows):
    """The rows of n sequences (grpocli.algorithms.packing.Rows; `loss_mask` here leaves tool turns
    out) and what the loss needs of them; per-sequence tensors are over completion tokens `[n, T]`."""

    advantages: torch.Tensor              # [n]
    index: torch.Tensor                   # [n] rows of the Rollouts they came from
    sequence_tokens: int = 0              # prompt + completion tokens of the n sequences, unpacked

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


@dataclass
class Selection:
    """Which rows of a Rollouts enter the loss: those that need a forward pass, and those that
    count in its normalisers but cannot move the gradient (no forward pass needed)."""

    computed: list[int]
    idle: list[int] = field(default_factory=list)
    idle_tokens: int = 0   # loss tokens of the idle rows


def select_sequences(rollouts: Rollouts, advantages: Advantages, *, mask_truncated: bool = False,
                     truncated_rows: str = "drop", skip_zero_advantage: bool = True) -> Selection:
    """The rows of kept groups (whole zero-spread groups leave only when dropped upstream).

    A truncated row under mask_truncated leaves every count ('drop': open-instruct, verl) or stays
    in the sequence counts with no loss token ('count': TRL). With `skip_zero_advantage` (no KL or
    entropy term, grpocli.trainer.step.LossSettings.zero_advantage_rows_matter), a row whose
    advantage is 0 is counted with its tokens but not computed: its loss and gradient are 0.
    """
    out = Selection(computed=[])
    for i in torch.nonzero(advantages.keep).flatten().tolist():
        if mask_truncated and bool(rollouts.truncated[i]):
            if truncated_rows == "count":
                out.idle.append(i)
        elif skip_zero_advantage and float(advantages.values[i]) == 0.0:
            out.idle.append(i)
            out.idle_tokens += rollouts.loss_tokens(i)
        else:
            out.computed.append(i)
    return out


@dataclass(frozen=True)
class OptimizerBatch:
    """What one optimizer step trains on, on this process."""

    micro_batches: tuple[MicroBatch, ...]
    idle_sequences: int = 0                 # in the normalisers, not computed (Selection.idle)
    idle_tokens: int = 0
    token_mean_tokens: float | None = None  # all processes: what token-mean losses divide by, if not
                                            # this step's loss tokens (TRL's generation-batch count)

    @property
    def loss_tokens(self) -> int:
        return sum(mb.num_tokens for mb in self.micro_batches) + self.idle_tokens


def make_micro_batches(
    rollouts: Rollouts,
    advantages: torch.Tensor,
    indices: list[int],
    *,
    max_sequences: int,
    max_tokens: int | None = None,
    layout: Layout = Layout(),
    pad_id: int = 0,
) -> list[MicroBatch]:
    """Group `indices` (in order) into micro-batches of at most `max_sequences` sequences, or
    (with `max_tokens`) of at most `max_tokens` sequence tokens, each laid out as `layout` says
    (`grpocli.algorithms.packing.choose_layout(model)`; padded rows by default; `pad_id` fills them, masked);
    `advantages` `[B*G]` are the rollouts' (each micro-batch carries its rows').
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
    return [_micro_batch(rollouts, advantages, [seqs[i] for i in rows], rows, layout, pad_id) for rows in batches]


def _micro_batch(rollouts: Rollouts, advantages: torch.Tensor, seqs: list[Sequence], rows: list[int],
                 layout: Layout, pad_id: int) -> MicroBatch:
    laid = build_rows(seqs, layout, pad_id)
    index = torch.tensor(rows, dtype=torch.long)
    return MicroBatch(
        **{f.name: getattr(laid, f.name) for f in fields(Rows) if f.name != "loss_mask"},
        loss_mask=_model_tokens(rollouts, rows, laid.loss_mask),
        advantages=advantages[index].float(), index=index, sequence_tokens=sum(len(p) + len(c) for _, p, c in seqs),
    )


def _model_tokens(rollouts: Rollouts, rows: list[int], loss_mask: torch.Tensor) -> torch.Tensor:
    """The loss mask `[n, T]` without the tool turns of multi-turn completions (their tokens are
    context, not the model's actions: no loss, no gradient); unchanged for single-turn ones."""
    if rollouts.completion_mask is None:
        return loss_mask
    own = torch.zeros_like(loss_mask)
    for row, i in enumerate(rows):
        mask = rollouts.completion_mask[i][: own.shape[1]]
        own[row, : len(mask)] = torch.tensor(mask, dtype=own.dtype)
    return loss_mask * own


def logprob_chunks(rollouts: Rollouts, micro_batches: tuple[MicroBatch, ...], *, max_sequences: int | None,
                   packed: bool, layout: Layout = Layout()) -> tuple[MicroBatch, ...] | None:
    """The no-grad log-prob passes of an optimizer batch (train.logprob_micro_batch_size): its sequences,
    in order, at most `max_sequences` per pass; with a token budget (`packed`) each micro-batch is cut on
    its own, so every pass keeps the budget. None (`max_sequences` None): the micro-batches themselves.
    `regroup` puts the passes' log-probs back into the micro-batches' shapes."""
    if max_sequences is None:
        return None
    groups = ([mb.index.tolist() for mb in micro_batches] if packed
              else [[i for mb in micro_batches for i in mb.index.tolist()]])
    unused = torch.zeros(len(rollouts.completion_ids))  # [B*G] advantages: a log-prob pass reads none
    return tuple(chunk for rows in groups if rows
                 for chunk in make_micro_batches(rollouts, unused, rows, max_sequences=max_sequences, layout=layout))


def regroup(values: tuple[torch.Tensor, ...], chunks: tuple[MicroBatch, ...],
            micro_batches: tuple[MicroBatch, ...]) -> tuple[torch.Tensor, ...]:
    """Per-sequence values `[n_c, T_c]` of each chunk (`logprob_chunks`) as one `[n, T]` tensor per
    micro-batch, each row the same sequence's (0 past its end, as in any micro-batch's tensors)."""
    where = {i: (k, j) for k, chunk in enumerate(chunks) for j, i in enumerate(chunk.index.tolist())}
    out = []
    for mb in micro_batches:
        n, t = mb.loss_mask.shape
        like = values[0] if values else mb.loss_mask
        dense = torch.zeros(n, t, dtype=like.dtype, device=like.device)                  # [n, T]
        for row, i in enumerate(mb.index.tolist()):
            k, j = where[i]
            width = min(t, values[k].shape[1])
            dense[row, :width] = values[k][j, :width]
        out.append(dense)
    return tuple(out)


def optimizer_batches(parallel: Parallel, scored: Scored, advantages: Advantages, *, algorithm: AlgorithmSection,
                      train: TrainSection, zero_advantage_rows_matter: bool,
                      layout: Layout) -> list[tuple[Scored, Advantages, OptimizerBatch]]:
    """Phase 5 before any log-prob pass: the generation batch cut into steps_per_generation slices
    of whole groups; in each, the rows that enter the loss (computed or idle) in micro-batches;
    with token_normalizer = "generation_batch", TRL's token count (the generation batch's loss
    tokens over every process / steps_per_generation) for the token-mean losses.
    `zero_advantage_rows_matter`: whether rows with advantage 0 must be computed
    (grpocli.trainer.step.LossSettings)."""
    a, t = algorithm, train
    n_slices = t.steps_per_generation
    per = scored.rollouts.num_prompts // n_slices
    cuts = []
    for k in range(n_slices):
        groups = list(range(k * per, (k + 1) * per))
        part, adv = scored.select(groups), advantages.select(groups)                     # [B/S*G]
        chosen = select_sequences(part.rollouts, adv, mask_truncated=a.mask_truncated_completions,
                                  truncated_rows=a.truncated_rows, skip_zero_advantage=not zero_advantage_rows_matter)
        micro_batches = make_micro_batches(part.rollouts, adv.values, chosen.computed, max_sequences=t.micro_batch_size,
                                           max_tokens=t.max_tokens_per_micro_batch, layout=layout)
        cuts.append((part, adv, micro_batches, chosen))
    tokens = None
    if a.token_normalizer == "generation_batch":
        loss_tokens = sum(sum(mb.num_tokens for mb in mbs) + chosen.idle_tokens for _, _, mbs, chosen in cuts)
        tokens = parallel.total(loss_tokens) / n_slices
    return [(part, adv, OptimizerBatch(tuple(mbs), idle_sequences=len(chosen.idle), idle_tokens=chosen.idle_tokens,
                                       token_mean_tokens=tokens))
            for part, adv, mbs, chosen in cuts]
