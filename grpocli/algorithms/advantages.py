"""Group-relative advantages, zero-spread groups and DAPO's soft overlong penalty.

Rewards arrive as `[B, G]`: B prompts, G completions (the group) per prompt, all finite.
Every advantage variant centers by the group mean (DeepSeekMath's GRPO, arXiv:2402.03300);
they differ only in what they divide by. The scales follow TRL's `GRPOTrainer`
(`scale_rewards` = "group" | "batch" | "none"): the *unbiased* standard deviation
(`torch.std`, Bessel's correction) and `eps = 1e-4` added to it.
"""

from __future__ import annotations

from typing import Callable

import torch

#: Added to the standard deviation before dividing (TRL uses 1e-4).
STD_EPS = 1e-4


def _centered(rewards: torch.Tensor) -> torch.Tensor:
    return rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]


def group_scaled_advantages(rewards: torch.Tensor, eps: float = STD_EPS) -> torch.Tensor:
    """GRPO (DeepSeekMath, arXiv:2402.03300): `(r - mean_g) / (std_g + eps)` per group.

    `std_g` is the unbiased std over the G completions of one prompt, as TRL's
    `scale_rewards="group"`; with G == 1 it is taken as 0 (the advantage is then 0).
    """
    rewards = rewards.float()  # [B, G]
    if rewards.shape[1] > 1:
        std = rewards.std(dim=1, keepdim=True)  # [B, 1]
    else:
        std = torch.zeros_like(rewards[:, :1])
    return _centered(rewards) / (std + eps)


def batch_scaled_advantages(rewards: torch.Tensor, eps: float = STD_EPS) -> torch.Tensor:
    """Center by the group mean, divide by the std of all rewards in the batch.

    TRL's `scale_rewards="batch"` (Liu et al., "Part I: Tricks or Traps?", arXiv:2508.08221):
    the std is the unbiased std of the raw rewards over all B*G completions.
    """
    rewards = rewards.float()  # [B, G]
    std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())  # []
    return _centered(rewards) / (std + eps)


def centered_advantages(rewards: torch.Tensor, eps: float = STD_EPS) -> torch.Tensor:
    """Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", arXiv:2503.20783): `r - mean_g`.

    No division, which removes the difficulty bias of the std; `eps` is accepted and unused.
    """
    del eps
    return _centered(rewards.float())


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "group": group_scaled_advantages,
    "batch": batch_scaled_advantages,
    "none": centered_advantages,
}


def zero_spread_groups(rewards: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """`bool [B]`: True where all G rewards of a prompt are equal within `atol`.

    Such groups give zero advantage and no gradient (TRL logs their share as
    `frac_reward_zero_std`; DAPO's dynamic sampling drops them).
    """
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values  # [B]
    return spread <= atol


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
