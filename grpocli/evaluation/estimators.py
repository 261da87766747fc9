"""Per-prompt estimators over N samples, averaged over prompts by the caller. Pure Python, no torch.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", HumanEval), 1 - C(n-c, k) / C(n, k), computed as their numerically stable product
1 - prod_{i=n-c+1}^{n} (1 - k / i). mean@N is the share of the N samples that succeed; maj@N
(self-consistency, Wang et al. 2022) asks whether the most frequent extracted answer succeeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_at_n(successes: Sequence[bool]) -> float:
    """Share of the samples that succeed (equals pass@1 for the same samples)."""
    return sum(map(bool, successes)) / len(successes) if successes else 0.0


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-None answer; ties go to the answer seen first. None when none was extracted."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def majority_at_n(answers: Sequence[str | None], successes: Sequence[bool]) -> float | None:
    """1.0 when the majority answer is right, judged by the samples that gave it (at least half of
    them succeed), else 0.0; None when no sample had an extractable answer."""
    chosen = majority_answer(answers)
    if chosen is None:
        return None
    votes = [bool(s) for a, s in zip(answers, successes) if a == chosen]
    return 1.0 if 2 * sum(votes) >= len(votes) else 0.0
