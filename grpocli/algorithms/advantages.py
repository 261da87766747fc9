"""Group-relative advantages, zero-spread groups and DAPO's soft overlong penalty.

Rewards arrive as `[B, G]`: B prompts, G completions (the group) per prompt, all finite.
Every advantage estimator uses the group as its baseline (DeepSeekMath's GRPO, arXiv:2402.03300);
they differ in the baseline (group mean, or leave-one-out mean) and in what they divide by.
The scales follow TRL's `GRPOTrainer` (`scale_rewards` = "group" | "batch" | "none"): the
*unbiased* standard deviation (`torch.std`, Bessel's correction) and `eps = 1e-4` added to it.

Every estimator (one entry each in grpocli.algorithms.variants.ADVANTAGES) has the same signature,
`fn(rewards [B, G], eps=STD_EPS, *, components=None, weights=None, mask=None) -> [B, G]`:
`components [B, G, R]` are the R rewards' own (unweighted) values, None/NaN counted as 0, and
`weights [R]` their recipe weights. Only the entries marked `needs_components` read them;
the others take the weighted total `rewards` only and ignore both.

`mask [B, G]` bool (None: every sample counts) says which samples were scored: a False one (a
reward failed on it: `[[rewards]] on_error = "mask"`) is left out of every mean and std, group
and batch alike, and gets advantage 0; a group of one scored sample has std 0 (as G == 1). With
mask None the numbers are exactly the unmasked formulas (TRL's).
"""

from __future__ import annotations

import torch

#: Added to the standard deviation before dividing (TRL uses 1e-4).
STD_EPS = 1e-4


def _weights(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`mask [B, G]` as 0/1 in `values`' dtype, with trailing size-1 dims to broadcast against it."""
    m = mask.to(values.dtype)
    return m.view(*m.shape, *([1] * (values.dim() - m.dim())))


def _group_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over dim 1 (the group) of the scored samples, kept as a size-1 dim (0 where none is)."""
    if mask is None:
        return values.mean(dim=1, keepdim=True)
    m = _weights(mask, values)
    return (values * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1)


def _centered(rewards: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return rewards - _group_mean(rewards, mask)  # [B, G]


def _group_std(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased std over dim 1 (the group) of the scored samples, kept as a size-1 dim; 0 where
    fewer than 2 are (G == 1: TRL)."""
    if mask is not None:
        m = _weights(mask, values)
        n = m.sum(dim=1, keepdim=True)
        squares = (((values - _group_mean(values, mask)) * m) ** 2).sum(dim=1, keepdim=True)
        return torch.where(n > 1, (squares / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(squares))
    if values.shape[1] > 1:
        return values.std(dim=1, keepdim=True)
    return torch.zeros_like(values[:, :1])


def _whiten(values: torch.Tensor, eps: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """`(x - mean) / (std + eps)` over every (scored) element; the std is unbiased, 0 for one element."""
    scored = values if mask is None else values[mask]  # [B*G] or fewer
    std = scored.std() if scored.numel() > 1 else values.new_zeros(())  # []
    mean = scored.mean() if scored.numel() else values.new_zeros(())  # []
    return (values - mean) / (std + eps)


def _unscored_zero(adv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Advantage 0 for the samples the mask leaves out."""
    return adv if mask is None else torch.where(mask, adv, torch.zeros_like(adv))  # [B, G]


def group_scaled_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO (DeepSeekMath, arXiv:2402.03300): `(r - mean_g) / (std_g + eps)` per group.

    `std_g` is the unbiased std over the G completions of one prompt, as TRL's
    `scale_rewards="group"`; with G == 1 it is taken as 0 (the advantage is then 0).
    `components` and `weights` are ignored.
    """
    del components, weights
    rewards = rewards.float()  # [B, G]
    return _unscored_zero(_centered(rewards, mask) / (_group_std(rewards, mask) + eps), mask)


def batch_scaled_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Center by the group mean, divide by the std of all rewards in the batch.

    TRL's `scale_rewards="batch"` (Liu et al., "Part I: Tricks or Traps?", arXiv:2508.08221):
    the std is the unbiased std of the raw rewards over all B*G completions.
    `components` and `weights` are ignored.
    """
    del components, weights
    rewards = rewards.float()  # [B, G]
    scored = rewards if mask is None else rewards[mask]  # [B*G] or fewer
    std = scored.std() if scored.numel() > 1 else rewards.new_zeros(())  # []
    return _unscored_zero(_centered(rewards, mask) / (std + eps), mask)


def centered_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", arXiv:2503.20783): `r - mean_g`.

    No division, which removes the difficulty bias of the std; `eps` is accepted and unused.
    The same numbers as open-instruct's `advantage_normalization_type="centered"`, which is
    this function under the recipe name "centered". `components` and `weights` are ignored.
    """
    del eps, components, weights
    return _unscored_zero(_centered(rewards.float(), mask), mask)


def rloo_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """RLOO (Ahmadian et al., "Back to Basics", arXiv:2402.14740; TRL's `RLOOTrainer`).

    The baseline of completion i is the mean of the *other* G - 1 rewards of its group:
    `A_i = r_i - (sum_g - r_i) / (G - 1)`, which equals `G / (G - 1) * (r_i - mean_g)`.
    No division by a std (TRL's `normalize_advantages=False`, its default). Needs G >= 2
    (`generation.num_generations` is >= 2); with G == 1 the advantage is 0, as in TRL.
    `eps`, `components` and `weights` are ignored.
    """
    del eps, components, weights
    rewards = rewards.float()  # [B, G]
    if mask is not None:  # the baseline: the mean of the group's other scored rewards
        m = mask.to(rewards.dtype)
        n = m.sum(dim=1, keepdim=True)                                            # [B, 1]
        baseline = ((rewards * m).sum(dim=1, keepdim=True) - rewards) / (n - 1).clamp(min=1)  # [B, G]
        return _unscored_zero(torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards)), mask)
    g = rewards.shape[1]
    if g < 2:
        return torch.zeros_like(rewards)
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)  # [B, G]
    return rewards - baseline


def reinforce_pp_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++ with baseline (Hu et al., arXiv:2501.03262; verl's `reinforce_plus_plus_baseline`).

    First the group mean is subtracted (`c = r - mean_g`), then `c` is whitened over the whole
    batch: `(c - mean(c)) / (std(c) + eps)`, mean and unbiased std over all B*G completions.
    Differences from verl's `compute_reinforce_plus_plus_baseline_outcome_advantage`: verl
    whitens the per-token copies of `c` (`masked_whiten` over response tokens, so a long
    completion weighs more in the batch mean and std) and divides by `sqrt(var + 1e-8)`; here
    each completion counts once, as in the paper's formula, and `eps` is added to the std like
    the other entries. `components` and `weights` are ignored.
    """
    del components, weights
    return _unscored_zero(_whiten(_centered(rewards.float(), mask), eps, mask), mask)


def normalize_then_sum_advantages(
    rewards: torch.Tensor, eps: float = STD_EPS, *, components: torch.Tensor | None = None,
    weights: torch.Tensor | None = None, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """GDPO (Liu et al., NVIDIA, "GDPO: Group reward-Decoupled Normalization Policy Optimization
    for Multi-reward RL Optimization", arXiv:2601.05242; NVlabs/GDPO's TRL implementation).

    Per reward k, normalised within its group on its own unweighted values:
    `n_k = (r_k - mean_g r_k) / (std_g r_k + eps)` (unbiased std, 0 for G == 1); then the weighted
    sum `s = sum_k w_k * n_k`; then, as in the paper, batch-wise normalisation of the sum
    `(s - mean(s)) / (std(s) + eps)` over all B*G completions (unbiased std), which keeps the scale
    from growing with the number of rewards.

    `components [B, G, R]`: each reward's values (NaN, i.e. a reward that returned None, counted
    as 0, as NVlabs' `nan_to_num`); `weights [R]` (default all 1). The weights are applied after
    the group normalisation: normalising weighted values would cancel them. The training loop
    passes DAPO's overlong penalty (added to the total only) as one more component with weight 1,
    so nothing in `rewards` is lost. Without `components` the total `rewards` is the single
    component (group normalisation, then batch whitening). Unlike NVlabs' code, one reward is not
    sent back to plain GRPO: the same steps apply to any R.
    """
    rewards = rewards.float()  # [B, G]
    if components is None:
        values = rewards.unsqueeze(-1)  # [B, G, 1]
    else:
        values = torch.nan_to_num(components.float(), nan=0.0)  # [B, G, R]
        if values.dim() != 3 or values.shape[:2] != rewards.shape:
            raise ValueError(f"components must be [B, G, R] = [{rewards.shape[0]}, {rewards.shape[1]}, R], "
                             f"got {list(values.shape)}")
    r = values.shape[-1]
    w = values.new_ones(r) if weights is None else torch.as_tensor(weights, dtype=torch.float32)  # [R]
    if w.shape != (r,):
        raise ValueError(f"weights must have one entry per component ({r}), got {list(w.shape)}")
    normed = (values - _group_mean(values, mask)) / (_group_std(values, mask) + eps)  # [B, G, R]
    return _unscored_zero(_whiten((normed * w).sum(dim=-1), eps, mask), mask)  # [B, G]


def zero_spread_groups(rewards: torch.Tensor, atol: float = 1e-6, mask: torch.Tensor | None = None) -> torch.Tensor:
    """`bool [B]`: True where all G rewards of a prompt (its scored ones, `mask [B, G]`) are equal
    within `atol`; with a mask, also where fewer than 2 are scored (no spread to learn from).

    Such groups give zero advantage and no gradient (TRL logs their share as
    `frac_reward_zero_std`; DAPO's dynamic sampling drops them).
    """
    if mask is None:
        spread = rewards.max(dim=1).values - rewards.min(dim=1).values  # [B]
        return spread <= atol
    high = torch.where(mask, rewards, torch.full_like(rewards, -torch.inf)).max(dim=1).values  # [B]
    low = torch.where(mask, rewards, torch.full_like(rewards, torch.inf)).min(dim=1).values    # [B]
    return (mask.sum(dim=1) < 2) | (high - low <= atol)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, penalty: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al., arXiv:2503.14476, eq. 13), added to the reward.

    With `start = max_len - buffer_len`: 0 for `length <= start`, then linear
    `(start - length) / buffer_len * penalty` down to `-penalty` at `max_len`, and `-penalty`
    beyond. `buffer_len == 0` turns it off (all zeros). `lengths [N]` -> `[N]` float32.
    """
    lengths = lengths.float()  # [N]
    if buffer_len <= 0:
        return torch.zeros_like(lengths)
    if buffer_len > max_len:
        raise ValueError(f"buffer_len ({buffer_len}) must not exceed max_len ({max_len})")
    start = max_len - buffer_len
    ramp = (start - lengths) / buffer_len * penalty  # [N], negative past start
    return ramp.clamp(min=-penalty, max=0.0)
