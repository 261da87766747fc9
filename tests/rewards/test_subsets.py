"""A batch scored in parts, each by its own rewards (grpocli.rewards.subsets, a [[data.sources]] mixture's
sources): every reward has a value per row, None where it does not score the row, and the parts' columns
never meet in one call."""

from __future__ import annotations

from grpocli.rewards.scoring import RewardFn
from grpocli.rewards.subsets import Subset, score_subsets


def gold_in(completions, gold, log_extra, **kwargs):
    log_extra("matched", [g in c for c, g in zip(completions, gold)])
    return [float(g in c) for c, g in zip(completions, gold)]


def short(completions, **kwargs):
    return [-len(c) / 10 for c in completions]


def test_each_part_gets_its_rewards_and_columns_and_the_rest_is_none():
    seen = []

    def odd(completions, target, **kwargs):
        seen.append(sorted(kwargs))
        return [float(len(c) % 2 == t % 2) for c, t in zip(completions, target)]

    fns = [RewardFn("gold_in", gold_in), RewardFn("short", short, weight=0.5), RewardFn("odd", odd)]
    parts = [
        Subset([0, 2], [0, 1], ["p0", "p2"], ["x 4", "y"], {"gold": ["4", "5"]}),
        Subset([1, 3], [2], ["q1", "q3"], ["ab", "abc"], {"target": [0, 0], "question": ["?", "?"]}),
        Subset([4], [], ["r"], ["zz"], {"other": [1]}),  # nothing scores it: total 0
    ]
    scores = score_subsets(fns, 5, parts)
    assert scores.per_reward == {"gold_in": [1.0, None, 0.0, None, None], "short": [-0.3, None, -0.1, None, None],
                                 "odd": [None, 1.0, None, 0.0, None]}
    assert scores.total == [1.0 - 0.15, 1.0, -0.05, 0.0, 0.0]
    assert scores.logged.columns == {"matched": [True, None, False, None, None]}
    assert scores.masked == {name: [False] * 5 for name in ("gold_in", "short", "odd")}
    assert set(scores.seconds) == {"gold_in", "short", "odd"}
    assert len(seen) == 1 and "question" in seen[0] and "gold" not in seen[0]  # b's own columns, not a's
