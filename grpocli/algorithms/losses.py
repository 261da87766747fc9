"""How each loss aggregates its per-token objective into one number: `LOSSES[algorithm.loss]`.

The per-token objectives are in grpocli.algorithms.surrogates (`SURROGATES`, same keys);
`clipped_surrogate` here is the plain PPO/GRPO one with explicit arguments.

Aggregation (TRL's `loss_type`; verl's `loss_agg_mode`), written so that a micro-batch returns
its *contribution*: summing the contributions of all micro-batches on all processes gives the
loss of the whole optimizer batch, however the batch was split. That makes grpo, dr_grpo and
dapo independent of micro-batch size, packing and process count (bnpo is per micro-batch by
definition, as in TRL).

What the caller must do (the functions cannot see the other micro-batches):
  * fill `LossNorm` with counts over the WHOLE optimizer batch, all processes (all-reduce them);
  * call `backward` on every micro-batch's contribution and step once: no further division by
    the number of accumulation steps (build `accelerate.Accelerator` with
    `gradient_accumulation_steps=1`, else `accelerator.backward` divides again);
  * DDP / FSDP / DeepSpeed *average* gradients over processes, so back-propagate
    `contribution * norm.world_size` to get the gradient of the batch loss;
  * the batch loss to log is the sum of contributions, summed (not averaged) across processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)` per token (PPO, arXiv:1707.06347;
    GRPO, arXiv:2402.03300; DAPO's decoupled range, arXiv:2503.14476).

    `logp`, `old_logp`: `[N, T]` log-probabilities of the sampled tokens under the policy being
    trained and the policy that sampled them (pass `logp.detach()` when they are the same, as
    TRL does with one iteration per batch). `advantages`: `[N]` (broadcast over T) or `[N, T]`.
    Returns `(per_token_loss [N, T], is_low_clipped [N, T], is_high_clipped [N, T])`; the flags
    mark where the clip is active, as TRL's `clip_ratio/low_mean` (ratio < 1 - eps_low, A < 0)
    and `clip_ratio/high_mean` (ratio > 1 + eps_high, A > 0).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # [N, 1]
    ratio = torch.exp(logp - old_logp)  # [N, T]
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # [N, T]
    per_token_loss = -torch.min(ratio * advantages, clipped * advantages)  # [N, T]
    is_low_clipped = (ratio < 1 - epsilon_low) & (advantages < 0)  # [N, T]
    is_high_clipped = (ratio > 1 + epsilon_high) & (advantages > 0)  # [N, T]
    return per_token_loss, is_low_clipped, is_high_clipped


@dataclass(frozen=True)
class LossNorm:
    """Counts over the whole optimizer batch (all micro-batches, all processes) that the
    aggregations divide by.

    num_sequences: completions in the batch (rows of every micro-batch, all processes).
    num_tokens: active (mask == 1) completion tokens in the batch.
    max_completion_length: the generation limit (Dr. GRPO's constant).
    num_micro_batches: micro-batches in the batch, all processes together (bnpo).
    world_size: processes whose gradients DDP averages; back-propagate
        `contribution * world_size` to undo that averaging. Not used by the aggregations.
    token_mean_tokens: what the token-mean losses (dapo, cispo, vespo) divide by, when it is
        not num_tokens: TRL divides by the generation batch's tokens / steps_per_generation.
    """

    num_sequences: int
    num_tokens: int
    max_completion_length: int
    num_micro_batches: int
    world_size: int = 1
    token_mean_tokens: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_sequences", "max_completion_length", "num_micro_batches", "world_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LossNorm.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_tokens < 0:
            raise ValueError(f"LossNorm.num_tokens must be >= 0, got {self.num_tokens}")


def _masked(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_token_loss * mask.to(per_token_loss.dtype)  # [N, T]


def grpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """GRPO (DeepSeekMath; TRL `loss_type="grpo"`, verl "seq-mean-token-mean"): the mean over
    sequences of each sequence's token mean. Contribution: `sum_i (sum_t l_it / T_i) / num_sequences`
    (a sequence with no active token contributes 0)."""
    mask = mask.to(per_token_loss.dtype)
    per_sequence = _masked(per_token_loss, mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [N]
    return per_sequence.sum() / norm.num_sequences


def bnpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """BNPO (TRL `loss_type="bnpo"`): the token mean of this micro-batch, averaged over the
    micro-batches: `(sum l / active tokens here) / num_micro_batches`. Depends on the split."""
    mask = mask.to(per_token_loss.dtype)
    return _masked(per_token_loss, mask).sum() / mask.sum().clamp(min=1.0) / norm.num_micro_batches


def dr_grpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783; TRL `loss_type="dr_grpo"`, verl "seq-mean-token-sum-norm"):
    `sum l / (max_completion_length * num_sequences)`, no length normalization."""
    denominator = norm.max_completion_length * norm.num_sequences
    return _masked(per_token_loss, mask).sum() / denominator


def dapo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """DAPO token-level loss (arXiv:2503.14476; TRL `loss_type="dapo"`, verl "token-mean"):
    `sum l / num_tokens`, the mean over every active token of the batch (0 when none); TRL's
    cispo and vespo aggregate the same way. `norm.token_mean_tokens`, when set, replaces num_tokens."""
    tokens = norm.token_mean_tokens if norm.token_mean_tokens is not None else norm.num_tokens
    return _masked(per_token_loss, mask).sum() / max(tokens, 1)


def luspo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv:2602.05261; TRL
    `loss_type="luspo"`): each sequence's token *sum* (GSPO's sequence loss scaled by its
    length), averaged over sequences: `sum l / num_sequences`."""
    return _masked(per_token_loss, mask).sum() / norm.num_sequences


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, LossNorm], torch.Tensor]] = {
    "grpo": grpo_loss,
    "bnpo": bnpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
    "cispo": dapo_loss,   # MiniMax-M1's objective (surrogates.cispo_surrogate), token mean
    "sapo": grpo_loss,    # SAPO's soft gate (surrogates.sapo_surrogate), sequence mean of token means
    "luspo": luspo_loss,
    "vespo": dapo_loss,   # VESPO's gamma weight (surrogates.vespo_surrogate), token mean
}
