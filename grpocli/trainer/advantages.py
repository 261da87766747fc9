"""Phase 4 of the loop: the advantages of a generation batch, over every process's groups.

Each process holds B groups of G completions; the rewards of all W processes are gathered
(`[W*B, G]`), the recipe's estimator (`ADVANTAGES[algorithm.advantage_scale]`,
grpocli.algorithms.variants) runs on all of them, and each process keeps its own slice. Groups
whose rewards have no spread are marked `flat`; with `drop_zero_spread_groups` they leave the
loss (`keep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpocli.algorithms.advantages import overlong_penalty, zero_spread_groups
from grpocli.algorithms.variants import ADVANTAGES
from grpocli.parallel import Parallel
from grpocli.rewards import RewardFn
from grpocli.trainer.rollouts import Advantages, Scored

if TYPE_CHECKING:
    from grpocli.recipe.algorithm_section import AlgorithmSection


def compute_advantages(parallel: Parallel, scored: Scored, algorithm: AlgorithmSection, *,
                       max_completion_length: int, reward_fns: list[RewardFn]) -> Advantages:
    """`values [B*G]`, `flat [B]` and `keep [B*G]` of this process's groups.

    An estimator that `needs_components` (GDPO's normalize_then_sum) also gets every reward's own
    values; for it a group is flat only where every one of those has no spread (equal totals
    can hide rewards that differ, which such an estimator still tells apart).
    """
    a, g = algorithm, scored.rollouts.group_size
    entry = ADVANTAGES[a.advantage_scale]
    everyone = parallel.gather(scored.rewards).view(-1, g)                      # [W*B, G]
    if entry.needs_components:
        values, weights = reward_components(scored, a, max_completion_length, reward_fns)  # [B*G, R], [R]
        n = values.shape[1]
        parts = parallel.gather(values.reshape(-1)).view(-1, g, n)              # [W*B, G, R]
        adv = entry.fn(everyone, components=parts, weights=weights)             # [W*B, G]
        all_flat = torch.stack([zero_spread_groups(parts[..., k]) for k in range(n)]).all(dim=0)  # [W*B]
    else:
        adv = entry.fn(everyone)                                                 # [W*B, G]
        all_flat = zero_spread_groups(everyone)                                  # [W*B]
    b, rank = scored.rollouts.num_prompts, parallel.rank
    flat = all_flat[rank * b : (rank + 1) * b]                                   # [B]
    keep = ~flat if a.drop_zero_spread_groups else torch.ones(b, dtype=torch.bool)
    return Advantages(values=adv[rank * b : (rank + 1) * b].reshape(-1), flat=flat,  # [B*G], [B]
                      keep=keep.repeat_interleave(g))                                # [B*G]


def reward_components(scored: Scored, algorithm: AlgorithmSection, max_completion_length: int,
                      reward_fns: list[RewardFn]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each reward's own values `[B*G, R]` (None as 0, as in the weighted sum) and weights `[R]`,
    in the order of the recipe's rewards; DAPO's overlong penalty, which the loop adds to the
    total only, as one more reward of weight 1, so the components hold all of the total."""
    columns = [[0.0 if v is None else float(v) for v in scored.per_reward[rf.name]] for rf in reward_fns]
    weights = [float(rf.weight) for rf in reward_fns]
    op = algorithm.overlong_penalty
    if op.buffer_length:
        columns.append(overlong_penalty(scored.rollouts.completion_lengths(), max_completion_length,
                                        op.buffer_length, op.penalty).tolist())
        weights.append(1.0)
    return torch.tensor(columns, dtype=torch.float32).T.contiguous(), torch.tensor(weights)
