"""Per-token estimators of KL(policy || reference) from sampled-token log-probabilities.

J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html).
Tokens are sampled from the policy; with `log_r = ref_logp - logp` (the log of ref/policy):
k1 = -log_r (unbiased, high variance, can be negative), k2 = log_r^2 / 2 (low variance, biased),
k3 = exp(log_r) - log_r - 1 (unbiased, non-negative; GRPO's choice in DeepSeekMath and TRL),
abs = |log_r| (used by some RLHF codebases, e.g. verl's "abs"). All map `[N, T]` -> `[N, T]`.
verl's names are entries too: kl (= k1), mse (= k2), low_var_kl (k3 with verl's clamps).
"""

from __future__ import annotations

from typing import Callable

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k1: `logp - ref_logp`."""
    return logp - ref_logp  # [N, T]


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k2: `0.5 * (logp - ref_logp)^2`."""
    return 0.5 * (logp - ref_logp) ** 2  # [N, T]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3: `exp(ref - logp) - (ref - logp) - 1` (DeepSeekMath GRPO, TRL's `per_token_kl`)."""
    log_r = ref_logp - logp  # [N, T]
    return torch.exp(log_r) - log_r - 1


def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """`|logp - ref_logp|` (verl's `kl_penalty="abs"`)."""
    return (logp - ref_logp).abs()  # [N, T]


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's `low_var_kl`: k3 with log_r clamped to [-20, 20] before exp and the result to
    [-10, 10] (verl `kl_penalty`, core_algos.py)."""
    log_r = torch.clamp(ref_logp - logp, min=-20, max=20)  # [N, T]
    return torch.clamp(torch.exp(log_r) - log_r - 1, min=-10, max=10)


#: algorithm.kl_estimator -> estimator (Schulman's names and verl's kl_loss_type names).
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "abs": kl_abs,
    "kl": kl_k1,
    "mse": kl_k2,
    "low_var_kl": kl_low_var,
}
