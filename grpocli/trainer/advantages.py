"""Phase 4 of the loop: the advantages of a generation batch, over every process's groups.

Each process holds B groups of G completions; the rewards of all W processes are gathered
(`[W*B, G]`), the recipe's estimator (`ADVANTAGES[algorithm.advantage_scale]`) runs on all of
them, and each process keeps its own slice. Groups whose rewards have no spread are marked
`flat`; with `drop_zero_spread_groups` they leave the loss (`keep`).
"""

from __future__ import annotations

from typing import Any

import torch

from grpocli.algorithms import (
    ADVANTAGES,
    NEEDS_COMPONENTS,
    overlong_penalty,
    zero_spread_groups,
)
from grpocli.trainer.collectives import gather_floats
from grpocli.trainer.rollouts import Rollouts


def compute_advantages(accelerator: Any, rollouts: Rollouts, recipe: Any, reward_fns: list) -> Rollouts:
    """The rollouts with `advantages [B*G]`, `flat [B]` and `keep [B*G]` set.

    The estimators in NEEDS_COMPONENTS (GDPO's normalize_then_sum) also get every reward's own
    values; for them a group is flat only where every one of those has no spread (equal totals
    can hide rewards that differ, which such an estimator still tells apart).
    """
    a, g = recipe.algorithm, rollouts.group_size
    everyone = gather_floats(accelerator, rollouts.rewards).view(-1, g)          # [W*B, G]
    if a.advantage_scale in NEEDS_COMPONENTS:
        values, weights = reward_components(rollouts, recipe, reward_fns)       # [B*G, R], [R]
        n = values.shape[1]
        parts = gather_floats(accelerator, values.reshape(-1)).view(-1, g, n)   # [W*B, G, R]
        adv = ADVANTAGES[a.advantage_scale](everyone, components=parts, weights=weights)  # [W*B, G]
        all_flat = torch.stack([zero_spread_groups(parts[..., k]) for k in range(n)]).all(dim=0)  # [W*B]
    else:
        adv = ADVANTAGES[a.advantage_scale](everyone)                            # [W*B, G]
        all_flat = zero_spread_groups(everyone)                                  # [W*B]
    b, rank = rollouts.num_prompts, accelerator.process_index
    flat = all_flat[rank * b : (rank + 1) * b]                                   # [B]
    keep = ~flat if a.drop_zero_spread_groups else torch.ones(b, dtype=torch.bool)
    rollouts.advantages = adv[rank * b : (rank + 1) * b].reshape(-1)             # [B*G]
    rollouts.flat, rollouts.keep = flat, keep.repeat_interleave(g)               # [B], [B*G]
    return rollouts


def reward_components(rollouts: Rollouts, recipe: Any, reward_fns: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Each reward's own values `[B*G, R]` (None as 0, as in the weighted sum) and weights `[R]`,
    in the order of the recipe's rewards; DAPO's overlong penalty, which the loop adds to the
    total only, as one more reward of weight 1, so the components hold all of the total."""
    columns = [[0.0 if v is None else float(v) for v in rollouts.per_reward[rf.name]] for rf in reward_fns]
    weights = [float(rf.weight) for rf in reward_fns]
    op = recipe.algorithm.overlong_penalty
    if op.buffer_length:
        columns.append(overlong_penalty(rollouts.completion_lengths(), recipe.generation.max_completion_length,
                                        op.buffer_length, op.penalty).tolist())
        weights.append(1.0)
    return torch.tensor(columns, dtype=torch.float32).T.contiguous(), torch.tensor(weights)
