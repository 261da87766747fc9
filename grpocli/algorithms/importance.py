"""Truncated importance sampling between the generation engine and the trainer.

The engine (vLLM) samples with its own kernels, and with asynchronous generation from weights
a few steps old, so its token probabilities differ from the trainer's. Truncated importance
sampling (Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
2025; TRL's `vllm_importance_sampling_correction`) weights each token's loss by
`min(exp(logp_trainer_old - logp_engine), cap)`.
"""

from __future__ import annotations

import torch


def truncated_importance_weights(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float
) -> torch.Tensor:
    """`min(exp(old_logp - engine_logp), cap)` per token: `[N, T]`, `[N, T]` -> `[N, T]`."""
    return torch.exp(old_logp - engine_logp).clamp(max=cap)


def mismatch_sums(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Masked sums and extremes of the gap and the (untruncated) ratio, for metrics."""
    on = mask.bool()
    if not on.any():
        return {"tokens": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "ratio_sum": 0.0,
                "ratio_min": float("inf"), "ratio_max": 0.0}
    gap = (old_logp - engine_logp)[on]  # [K]
    ratio = gap.exp()
    return {"tokens": float(on.sum()), "gap_sum": float(gap.abs().sum()), "gap_max": float(gap.abs().max()),
            "ratio_sum": float(ratio.sum()), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}
