"""Per-token policy objectives: what each loss minimises at a token before it is aggregated.

`SURROGATES[algorithm.loss]` takes `PolicyTerms` (the current log-probs, the importance ratio
to the policy that generated, the advantages, the mask) and `SurrogateSettings`, and returns
`(per_token_loss, low_flags, high_flags)`. The loss is `[N, T]`, or `[N, 1]` for a
sequence-level ratio (GSPO), which the aggregation broadcasts over the sequence's tokens.
The flags mark where a clip is active (TRL's `clip_ratio/low_mean`, `high_mean`).
Formulas follow TRL 1.16's `GRPOTrainer._compute_loss`, checked against its numbers
(tests/algorithms/test_trl_oracle.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch


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


Surrogate = Callable[[PolicyTerms, SurrogateSettings], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

#: algorithm.loss -> its per-token objective (the aggregation is grpocli.algorithms.losses.LOSSES).
SURROGATES: dict[str, Surrogate] = {
    "grpo": clip_surrogate,
    "bnpo": clip_surrogate,
    "dr_grpo": clip_surrogate,
    "dapo": clip_surrogate,
    "luspo": clip_surrogate,
    "cispo": cispo_surrogate,
    "sapo": sapo_surrogate,
    "vespo": vespo_surrogate,
}

#: Losses that weigh engine importance weights into their own objective (not a multiplier).
OWN_ENGINE_WEIGHTS = frozenset({"vespo"})


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """Tokens whose entropy is in the top `top_quantile` of the masked tokens (Wang et al. 2025,
    "Beyond the 80/20 Rule", arXiv:2506.01939; TRL `top_entropy_quantile`): `[N, T]` float."""
    on = mask > 0
    values = entropy.detach()[on].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1 - top_quantile)
    return ((entropy.detach() * mask >= threshold) & on).to(mask.dtype)
