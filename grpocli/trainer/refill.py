"""One more sampling round for the groups that rewards left with fewer than 2 scored samples.

A reward under ``[[rewards]] on_error = "mask"`` that fails on some rows leaves them unscored
(grpocli.rewards.failures.mask_rows); a group with fewer than 2 scored samples has no spread to
learn from and is dropped (grpocli.trainer.rollouts.compute_advantages). With
``algorithm.fill_batch`` such a group counts as flat and the fill rounds replace it. Without it,
the loop samples one extra round of just that many prompts (`most_unscorable`) and puts the first
groups of it that can be scored in their place (`refilled`); groups of the extra round that cannot
be scored either are not used, and a group that finds no replacement stays in the batch, dropped.
Not done with generation.async_steps or the in-flight pipeline, whose engines generate on their
own threads (as fill_batch is not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from grpocli.parallel import Parallel
from grpocli.trainer.rollouts import Sampled, Scored, flat_groups, keep_informative

if TYPE_CHECKING:
    from grpocli.recipe.algorithm_section import AlgorithmSection


def more_rounds(sampled: list[Sampled], sample: Callable[[int], Sampled], algorithm: AlgorithmSection,
                parallel: Parallel, info: dict[str, Any], *, n_prompts: int, may_refill: bool) -> Scored:
    """The batch after the rounds it needs, each appended to `sampled` (`sample(n)`: n more prompts' groups,
    over all processes): with algorithm.fill_batch, DAPO's dynamic sampling, rounds of `n_prompts` until no
    group is flat (the first informative groups kept, `info["fill_rounds"]` counted); else, where `may_refill`,
    one round for the groups a failing reward left with fewer than 2 scored samples."""
    scored = sampled[0].scored
    if algorithm.fill_batch:
        for _ in range(algorithm.max_fill_rounds):
            have = sum(int((~flat_groups(x.scored)).sum()) for x in sampled)
            if parallel.fewest(have) >= scored.rollouts.num_prompts:
                break
            sampled.append(sample(n_prompts))
        info["fill_rounds"] = len(sampled) - 1
        return keep_informative([x.scored for x in sampled], scored.rollouts.num_prompts)
    if may_refill and (k := most_unscorable(parallel, scored)):
        sampled.append(sample(k * parallel.size))
        return refilled(scored, sampled[-1].scored)
    return scored


def unscorable(scored: Scored) -> torch.Tensor:
    """`bool [B]`: the groups with fewer than 2 scored samples."""
    g = scored.rollouts.group_size
    masked = scored.masked.view(-1, g)                   # [B, G]
    return masked.any(dim=1) & (g - masked.sum(dim=1) < 2)  # [B]


def most_unscorable(parallel: Parallel, scored: Scored) -> int:
    """The most such groups any process has: every process samples that many prompts again (the
    backends generate in lockstep), each using what it needs."""
    return -parallel.fewest(-int(unscorable(scored).sum()))


def refilled(scored: Scored, extra: Scored) -> Scored:
    """`scored` with each group of fewer than 2 scored samples replaced, in order, by the next group
    of `extra` that has 2 or more; the batch keeps its size and order."""
    spare = [scored.rollouts.num_prompts + j for j, bad in enumerate(unscorable(extra).tolist()) if not bad]
    order = [spare.pop(0) if bad and spare else i for i, bad in enumerate(unscorable(scored).tolist())]
    return Scored.concat([scored, extra]).select(order)
