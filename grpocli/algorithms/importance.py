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

OpenRLHF 0.11's correction (`--algo.advantage.is_correction_level/_mode/_gating/_threshold`,
openrlhf/models/loss.py `PolicyLoss`) is a gate: a statistic per token or per sequence is read, and
a unit outside its band is dropped (weight 0) while the tokens that stay keep their own token
ratio, unbounded. Its token-level ratio gates are `token_mask` (mode mask) and `token_truncate`
(mode clip); the others are here: the sequence's geometric-mean ratio (`sequence_geomean_mask`), or
a divergence between the engine's and the trainer's probability of the sampled token, binary KL or
total variation, per token or as the sequence's mean (`*_binary_kl_mask`, `*_tv_mask`), bounded
above by `divergence_max` (vllm.importance_sampling_divergence_max). These return `[N, T]`.

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


def _gated(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each token's own ratio where `keep` (`[N, T]` or `[N, 1]`), else 0: OpenRLHF's mask mode."""
    ratio = log_ratio.exp()
    return torch.where(keep, ratio, torch.zeros_like(ratio))  # [N, T]


def _sequence_mean(stat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The masked mean of a per-token statistic over each sequence's loss tokens, `[N, 1]`."""
    m = mask.to(stat.dtype)
    return (stat * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)


def _divergence(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """OpenRLHF's per-token divergence of the sampled token's probability, engine p vs trainer q, both clamped to
    [1e-6, 1 - 1e-6]: binary KL `p ln(p/q) + (1-p) ln((1-p)/(1-q))` or total variation `|p - q|`; in float64 (a
    binary KL of near-equal float32 probabilities could otherwise round below 0), 0 outside `mask` and where
    the engine log-prob is NaN (missing: no correction, as in TRL)."""
    old64, engine64 = old_logp.double(), engine_logp.double()
    engine64 = torch.where(torch.isnan(engine64), old64, engine64)
    p, q = engine64.exp().clamp(1e-6, 1 - 1e-6), old64.exp().clamp(1e-6, 1 - 1e-6)
    if kind == "binary_kl":
        stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
    else:
        stat = (p - q).abs()
    return stat * mask.double()  # [N, T]


def sequence_geomean_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None,
) -> torch.Tensor:
    """Sequence-gated token IS: each token's own ratio `exp(old - engine)` where its sequence's geometric-mean
    ratio `exp(mean_t (old - engine))` lies in `[clip_min, clip_max]`, 0 for every token of a sequence outside,
    `[N, T]`.

    OpenRLHF 0.11.2 (https://github.com/OpenRLHF/OpenRLHF, openrlhf/models/loss.py `PolicyLoss`):
    `--algo.advantage.is_correction_level seq --algo.advantage.is_correction_mode mask
    --algo.advantage.is_correction_gating ratio --algo.advantage.is_correction_threshold LOW HIGH` (its
    "seq-mask-tis"). Unlike `sequence_mask`, the gate reads the mean, not the sum, of the log-ratios, and the
    tokens kept are weighted by their own ratios.
    """
    log_ratio = _log_ratio(old_logp, engine_logp, mask)                             # [N, T]
    geomean = _sequence_mean(log_ratio, mask).exp()                                  # [N, 1]
    return _gated(log_ratio, _mask_outside(geomean, clip_min, clip_max) > 0)


def _divergence_gate(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, kind: str,
                     per_sequence: bool, divergence_max: float) -> torch.Tensor:
    stat = _divergence(old_logp, engine_logp, mask, kind)                            # [N, T]
    if per_sequence:
        stat = _sequence_mean(stat, mask)                                            # [N, 1]
    return _gated(_log_ratio(old_logp, engine_logp, mask), stat <= divergence_max)


def token_binary_kl_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None, *, divergence_max: float,
) -> torch.Tensor:
    """Token IS gated by the binary KL: each token's own ratio `exp(old - engine)` where the binary KL between
    the engine's and the trainer's probability of the sampled token is at most `divergence_max`, else 0, `[N, T]`
    (clip_min / clip_max unused).

    OpenRLHF 0.11.2 (https://github.com/OpenRLHF/OpenRLHF, openrlhf/models/loss.py `PolicyLoss`):
    `--algo.advantage.is_correction_level token --algo.advantage.is_correction_gating binary_kl
    --algo.advantage.is_correction_threshold HIGH` (mode mask). OpenRLHF's lower bound is 0.0.
    """
    return _divergence_gate(old_logp, engine_logp, mask, "binary_kl", False, divergence_max)


def token_tv_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None, *, divergence_max: float,
) -> torch.Tensor:
    """Token IS gated by total variation: each token's own ratio where `|p_engine - p_trainer|` of the sampled
    token is at most `divergence_max`, else 0, `[N, T]` (clip_min / clip_max unused).

    OpenRLHF 0.11.2 (https://github.com/OpenRLHF/OpenRLHF, openrlhf/models/loss.py `PolicyLoss`):
    `--algo.advantage.is_correction_level token --algo.advantage.is_correction_gating tv
    --algo.advantage.is_correction_threshold HIGH` (mode mask).
    """
    return _divergence_gate(old_logp, engine_logp, mask, "tv", False, divergence_max)


def sequence_binary_kl_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None, *, divergence_max: float,
) -> torch.Tensor:
    """Sequence-gated token IS by the mean binary KL: each token's own ratio where its sequence's mean per-token
    binary KL (engine vs trainer probability of the sampled tokens) is at most `divergence_max`, 0 for every token
    of a sequence above it, `[N, T]` (clip_min / clip_max unused).

    OpenRLHF 0.11.2 (https://github.com/OpenRLHF/OpenRLHF, openrlhf/models/loss.py `PolicyLoss`):
    `--algo.advantage.is_correction_level seq --algo.advantage.is_correction_gating binary_kl
    --algo.advantage.is_correction_threshold HIGH` (mode mask): the trust region of FlashREINFORCE, as OpenRLHF
    names it.
    """
    return _divergence_gate(old_logp, engine_logp, mask, "binary_kl", True, divergence_max)


def sequence_tv_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
    clip_min: float | None, clip_max: float | None, *, divergence_max: float,
) -> torch.Tensor:
    """Sequence-gated token IS by the mean total variation: each token's own ratio where its sequence's mean
    `|p_engine - p_trainer|` is at most `divergence_max`, 0 for every token of a sequence above it, `[N, T]`
    (clip_min / clip_max unused).

    OpenRLHF 0.11.2 (https://github.com/OpenRLHF/OpenRLHF, openrlhf/models/loss.py `PolicyLoss`):
    `--algo.advantage.is_correction_level seq --algo.advantage.is_correction_gating tv
    --algo.advantage.is_correction_threshold HIGH` (mode mask).
    """
    return _divergence_gate(old_logp, engine_logp, mask, "tv", True, divergence_max)


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
