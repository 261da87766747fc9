"""The losses: a per-token objective, then an aggregation of the per-token terms into one number.

Which pair each recipe name (algorithm.loss) is, and its properties, is one entry of
`grpocli.algorithms.variants.LOSSES`; the functions are here.

Per-token objectives take `PolicyTerms` (the current log-probs, the importance ratio to the
policy that generated, the advantages, the mask) and `SurrogateSettings`, and return
`(per_token_loss, low_flags, high_flags)`. The loss is `[N, T]`, or `[N, 1]` for a
sequence-level ratio (GSPO) or a per-sequence objective (GMPO), which the aggregation broadcasts
over the sequence's tokens.
The flags mark where a clip is active (TRL's `clip_ratio/low_mean`, `high_mean`). Formulas
follow TRL 1.16's `GRPOTrainer._compute_loss`, checked against its numbers
(tests/trainer/test_trl_parity.py).

Aggregations (TRL's `loss_type`; verl's `loss_agg_mode`) are written so that a micro-batch
returns its *contribution*: summing the contributions of all micro-batches on all processes gives
the loss of the whole optimizer batch, however the batch was split. That makes grpo, dr_grpo and
dapo independent of micro-batch size, packing and process count (bnpo is per micro-batch by
definition, as in TRL). What the caller must do (the functions cannot see the other micro-batches):

  * fill `LossNorm` with counts over the WHOLE optimizer batch, all processes (all-reduce them);
  * call `backward` on every micro-batch's contribution and step once: no further division by
    the number of accumulation steps (build `accelerate.Accelerator` with
    `gradient_accumulation_steps=1`, else `accelerator.backward` divides again);
  * DDP / FSDP / DeepSpeed *average* gradients over processes, so back-propagate
    `contribution * norm.world_size` to get the gradient of the batch loss (the trainer's
    parallel strategy does: `Parallel.backward`);
  * the batch loss to log is the sum of contributions, summed (not averaged) across processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


# -- per-token objectives --------------------------------------------------------------------
@dataclass(frozen=True)
class SurrogateSettings:
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2           # clip: ratio <= 1 + epsilon_high; cispo: ratio <= epsilon_high
    delta: float | None = None          # two-sided clipping (INTELLECT-2): ratio <= delta
    clip_ratio_c: float | None = None   # dual clip (verl): loss <= -c * A where A < 0
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


@dataclass
class PolicyTerms:
    """What every objective may read; shapes for N sequences of up to T completion tokens."""

    logp: torch.Tensor                  # [N, T] current policy, with gradient (0 where masked)
    log_ratio: torch.Tensor             # [N, T] logp - old_logp per token
    ratio: torch.Tensor                 # [N, T] per token, or [N, 1] per sequence (GSPO)
    advantages: torch.Tensor            # [N, 1]
    mask: torch.Tensor                  # [N, T] 1.0 on tokens in the loss
    engine_weight: torch.Tensor | None = None  # [N, T] engine importance weights, where corrected


def importance_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """`exp(logp - old)` per token (`"token"`: PPO, GRPO) or `exp` of its masked mean per sequence
    (`"sequence"`: GSPO, Zheng et al. 2025, arXiv:2507.18071; TRL importance_sampling_level)."""
    if level == "token":
        return torch.exp(log_ratio)                                               # [N, T]
    if level == "sequence":
        mean = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        return torch.exp(mean)                                                    # [N, 1]
    raise ValueError(f"unknown importance sampling level {level!r}: 'token' or 'sequence'")


def clip_surrogate(x: PolicyTerms, s: SurrogateSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped objective (Schulman et al. 2017, arXiv:1707.06347) with GRPO's advantages
    (DeepSeekMath, arXiv:2402.03300) and DAPO's decoupled clip range (arXiv:2503.14476):
    `-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`. With `delta`, INTELLECT-2's two-sided
    clipping (arXiv:2505.07291; TRL `delta`) caps the unclipped ratio at delta; with
    `clip_ratio_c`, Dual-Clip PPO (Ye et al. 2020, arXiv:1912.09729; verl `clip_ratio_c`) bounds
    the loss of a negative advantage by `-c A`. Used by grpo, bnpo, dr_grpo, dapo and luspo."""
    a, ratio = x.advantages, x.ratio
    clipped = torch.clamp(ratio, 1 - s.epsilon_low, 1 + s.epsilon_high)
    unclipped = torch.clamp(ratio, max=s.delta) if s.delta is not None else ratio
    loss = -torch.min(unclipped * a, clipped * a)
    if s.clip_ratio_c is not None:
        loss = torch.where(a < 0, torch.min(loss, -a * s.clip_ratio_c), loss)
    low = (ratio < 1 - s.epsilon_low) & (a < 0)
    high = (ratio > 1 + s.epsilon_high) & (a > 0)
    return loss, low, high


def cispo_surrogate(x: PolicyTerms, s: SurrogateSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585; TRL `loss_type="cispo"`): clip the importance weight,
    not the update: `-sg(min(r, eps_high)) A logp`, so every token keeps a gradient. High flag:
    the weight was capped where A > 0 (TRL's `cispo_clip_ratio`)."""
    weight = torch.clamp(x.ratio, max=s.epsilon_high).detach()
    loss = -weight * x.advantages * x.logp
    high = (x.ratio > s.epsilon_high) & (x.advantages > 0)
    return loss, torch.zeros_like(high), high


def sapo_surrogate(x: PolicyTerms, s: SurrogateSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347; TRL
    `loss_type="sapo"`): a smooth gate instead of a hard clip, `-sigmoid(tau (r - 1)) 4 / tau A`
    with tau_pos where A > 0, tau_neg elsewhere."""
    tau = torch.where(x.advantages > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
    loss = -torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * x.advantages
    none = torch.zeros_like(loss, dtype=torch.bool)
    return loss, none, none


@torch.no_grad()
def vespo_weights(x: PolicyTerms, s: SurrogateSettings) -> torch.Tensor:
    """VESPO's gamma weight of the sequence ratio w, `phi(w) = e^lambda w^k e^(-lambda w)` (phi(1) = 1),
    k and lambda by the sign of A; engine importance weights multiply w. `[N, 1]`, no gradient."""
    low = math.log(1e-8)
    log_w = (torch.clamp(x.log_ratio, -20.0, 20.0) * x.mask).sum(-1, keepdim=True)      # [N, 1]
    if x.engine_weight is not None:  # [N, T] per token, or [N, 1] per sequence
        log_is = torch.clamp(torch.log(x.engine_weight), low, 20.0)
        if log_is.shape[-1] > 1:
            log_is = torch.where(x.mask > 0, log_is, torch.zeros_like(log_is)).sum(-1, keepdim=True)
        log_w = log_w + log_is
    log_w = torch.clamp(log_w, low, 20.0)
    nonneg = x.advantages >= 0
    k = torch.where(nonneg, s.vespo_k_pos, s.vespo_k_neg)
    lam = torch.where(nonneg, s.vespo_lambda_pos, s.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_surrogate(x: PolicyTerms, s: SurrogateSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VESPO (arXiv:2602.10693; TRL `loss_type="vespo"`): `-phi(w) A logp` with the gamma weight
    of `vespo_weights` on the whole sequence's ratio; engine weights enter phi, not the loss."""
    loss = -vespo_weights(x, s) * x.advantages * x.logp
    none = torch.zeros_like(loss, dtype=torch.bool)
    return loss, none, none


def gmpo_surrogate(x: PolicyTerms, s: SurrogateSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673; TRL 1.16's
    `trl.experimental.gmpo.GMPOTrainer._compute_loss`): one term per sequence, `[N, 1]`,
    `-exp(mean_t clip(log r_t)) A`, the geometric mean of the token ratios over the sequence's loss
    tokens, each log-ratio clipped sign-aware in LOG space (PPO's min written in logs:
    `min(log r, clamp(log r, -eps_low, eps_high))` where A > 0, `max(...)` elsewhere). Here
    epsilon_low / epsilon_high are log-space bounds (the ratio range is `(e^-eps_low, e^eps_high)`;
    TRL's GMPOConfig default: epsilon = 0.4, epsilon_high = epsilon). Reads the token log-ratios,
    never `x.ratio`: importance_sampling_level 'token' only. Flags as TRL's: log r < -eps_low
    where A < 0, log r > eps_high where A > 0."""
    a, log_r = x.advantages, x.log_ratio
    clamped = torch.clamp(log_r, min=-s.epsilon_low, max=s.epsilon_high)
    clipped = torch.where(a > 0, torch.minimum(log_r, clamped), torch.maximum(log_r, clamped))  # [N, T]
    mask = x.mask.to(log_r.dtype)
    log_weight = (clipped * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    loss = -torch.exp(log_weight) * a                                                      # [N, 1]
    low = (log_r < -s.epsilon_low) & (a < 0)
    high = (log_r > s.epsilon_high) & (a > 0)
    return loss, low, high


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """Tokens whose entropy is in the top `top_quantile` of the masked tokens (Wang et al. 2025,
    "Beyond the 80/20 Rule", arXiv:2506.01939; TRL `top_entropy_quantile`): `[N, T]` float."""
    on = mask > 0
    values = entropy.detach()[on].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1 - top_quantile)
    return ((entropy.detach() * mask >= threshold) & on).to(mask.dtype)


# -- aggregations ------------------------------------------------------------------------------
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
    """GRPO (DeepSeekMath, arXiv:2402.03300; TRL `loss_type="grpo"`, verl "seq-mean-token-mean"): the mean over
    sequences of each sequence's token mean. Contribution: `sum_i (sum_t l_it / T_i) / num_sequences`
    (a sequence with no active token contributes 0)."""
    mask = mask.to(per_token_loss.dtype)
    per_sequence = _masked(per_token_loss, mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [N]
    return per_sequence.sum() / norm.num_sequences


def bnpo_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """BNPO (TRL `loss_type="bnpo"`, https://huggingface.co/docs/trl/grpo_trainer): the token mean of
    this micro-batch, averaged over the micro-batches: `(sum l / active tokens here) /
    num_micro_batches`. Depends on the split."""
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
