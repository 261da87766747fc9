"""Importance sampling between the generation engine and the trainer.

The engine (vLLM) samples with its own kernels, and with asynchronous generation from weights
a few steps old, so its token probabilities differ from the trainer's. Each completion's loss is
weighted by the ratio `exp(logp_trainer_old - logp_engine)`, bounded in one of TRL's four ways
(TRL 1.16 `GRPOConfig.vllm_importance_sampling_mode`, computed as in `GRPOTrainer`'s
`_generate_and_score_completions`):

* granularity: per token (`token_*`, `[N, T]`), or one ratio per sequence from the summed
  log-ratio (`sequence_*`, `[N, 1]`, applied to every token of the sequence);
* constraint: ratios clamped into `[clip_min, clip_max]` (`*_truncate`), or ratios outside it
  set to 0 (`*_mask`). A `None` bound is no bound.

As in TRL, the log-ratio is zeroed outside `mask` and where it is NaN (an engine log-prob that is
missing), so such tokens have ratio 1 (and add 0 to a sequence's sum).

`grpocli.algorithms.variants.IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]` names the function.
"""

from __future__ import annotations

import math

import torch


def _log_ratio(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(old - engine) * mask`, NaN -> 0 (TRL: an unavailable engine log-prob means no correction)."""
    return torch.nan_to_num((old_logp - engine_logp) * mask, nan=0.0)  # [N, T]


def _truncate(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    if clip_min is None and clip_max is None:  # TRL refuses this in its config; here: no bound
        return ratio
    return ratio.clamp(min=clip_min, max=clip_max)


def _mask_outside(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


def token_truncate(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None,
) -> torch.Tensor:
    """Token-level truncated IS: `clamp(exp(old - engine), clip_min, clip_max)` per token, `[N, T]`.

    Truncated importance sampling (TIS) of Yao et al., "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training" (2025, https://fengyao.notion.site/off-policy-rl), which
    caps the ratio from above; TRL's `"token_truncate"` adds the optional lower bound. Our
    default mode (`vllm.importance_sampling_mode`), with clip_max 2.0.
    """
    return _truncate(_log_ratio(old_logp, engine_logp, mask).exp(), clip_min, clip_max)


def token_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None,
) -> torch.Tensor:
    """Token-level masked IS: `exp(old - engine)` per token, 0 outside `[clip_min, clip_max]`, `[N, T]`.

    TRL's `"token_mask"`. Masked importance sampling (MIS) is from Liu, Li et al., "When Speed
    Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch" (blog, 2025,
    https://richardli.xyz/rl-collapse); at token level with two bounds it is the IcePop rule
    (Ant Ling team, "Small Leak Can Sink a Great Ship", 2025).
    """
    return _mask_outside(_log_ratio(old_logp, engine_logp, mask).exp(), clip_min, clip_max)


def sequence_truncate(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None,
) -> torch.Tensor:
    """Sequence-level truncated IS: `clamp(exp(sum_t (old - engine)), clip_min, clip_max)`, `[N, 1]`.

    TRL's `"sequence_truncate"`: the sequence-level ratio of Liu, Li et al., "When Speed Kills
    Stability" (2025, https://richardli.xyz/rl-collapse), truncated as in Yao et al.'s TIS (2025).
    """
    ratio = _log_ratio(old_logp, engine_logp, mask).sum(dim=-1, keepdim=True).exp()  # [N, 1]
    return _truncate(ratio, clip_min, clip_max)


def sequence_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None,
) -> torch.Tensor:
    """Sequence-level masked IS: `exp(sum_t (old - engine))`, 0 outside `[clip_min, clip_max]`, `[N, 1]`.

    TRL's `"sequence_mask"` (TRL 1.16's default mode, clip_max 3.0): the sequence-level MIS of
    Liu, Li et al., "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch" (blog, 2025, https://richardli.xyz/rl-collapse), which drops
    whole sequences whose ratio leaves the bounds.
    """
    ratio = _log_ratio(old_logp, engine_logp, mask).sum(dim=-1, keepdim=True).exp()  # [N, 1]
    return _mask_outside(ratio, clip_min, clip_max)


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
