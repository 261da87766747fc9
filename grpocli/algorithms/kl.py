"""Per-token estimators of KL(policy || reference) from sampled-token log-probabilities.

J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html).
Tokens are sampled from the policy; with `log_r = ref_logp - logp` (the log of ref/policy):
k1 = -log_r (unbiased, high variance, can be negative), k2 = log_r^2 / 2 (low variance, biased),
k3 = exp(log_r) - log_r - 1 (unbiased, non-negative; GRPO's choice in DeepSeekMath and TRL),
abs = |log_r| (used by some RLHF codebases, e.g. verl's "abs"). All map `[N, T]` -> `[N, T]`.
verl's names are entries too: kl (= k1), mse (= k2), low_var_kl (k3 with verl's clamps); each name is
one entry of grpocli.algorithms.variants.KL_ESTIMATORS.
"""

from __future__ import annotations

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k1 (http://joschu.net/blog/kl-approx.html): `logp - ref_logp`."""
    return logp - ref_logp  # [N, T]


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k2 (http://joschu.net/blog/kl-approx.html): `0.5 * (logp - ref_logp)^2`."""
    return 0.5 * (logp - ref_logp) ** 2  # [N, T]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 (http://joschu.net/blog/kl-approx.html): `exp(ref - logp) - (ref - logp) - 1`
    (DeepSeekMath's GRPO, arXiv:2402.03300; TRL's `per_token_kl`)."""
    log_r = ref_logp - logp  # [N, T]
    return torch.exp(log_r) - log_r - 1


def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """`|logp - ref_logp|` (verl's `kl_penalty="abs"`, https://github.com/volcengine/verl core_algos.py)."""
    return (logp - ref_logp).abs()  # [N, T]


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's `low_var_kl`: k3 with log_r clamped to [-20, 20] before exp and the result to
    [-10, 10] (verl `kl_penalty`, https://github.com/volcengine/verl core_algos.py)."""
    log_r = torch.clamp(ref_logp - logp, min=-20, max=20)  # [N, T]
    return torch.clamp(torch.exp(log_r) - log_r - 1, min=-10, max=10)
