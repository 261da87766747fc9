"""Score a batch whose rows come in parts, each scored by its own rewards: a weighted mixture's sources
([[data.sources]], each with its columns, prompt column and ``rewards``).

Each part is scored as a batch of its own (grpocli.rewards.score: its rows' columns only, so sources with
different columns never meet in one call; the combination over its own rewards), and the parts' scores are
put back in the batch's order: a reward that does not score a part gives None on its rows (TRL's "does not
apply": left out of the reward's mean, 0 in the total), is not masked there and logs nothing there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from grpocli.rewards.scoring import RewardFn, RewardLog, Scores, score


@dataclass(frozen=True)
class Subset:
    """Some rows of a batch and the rewards that score them."""

    rows: list[int]                  # [m] the rows' indices in the batch
    fns: list[int]                   # indices of the batch's reward functions that score them
    prompts: list[Any]               # [m]
    completions: list[Any]           # [m]
    columns: dict[str, list[Any]]    # [m] each: the rows' own columns
    completion_ids: list[Any] | None = None  # [m]


def score_subsets(fns: list[RewardFn], n: int, subsets: list[Subset], combination: Literal["sum", "gated"] = "sum",
                  *, state: Any = None, doing: Callable[[str], None] | None = None) -> Scores:
    """The Scores of an ``n``-row batch made of ``subsets`` (disjoint, covering every row), each scored by its
    own rewards; every reward of ``fns`` has a value per row (None where it does not score the row)."""
    parts = []
    for part in subsets:
        chosen = [fns[k] for k in part.fns]
        if chosen:
            parts.append((part.rows, score(chosen, part.prompts, part.completions, part.columns, combination,
                                           completion_ids=part.completion_ids, state=state, doing=doing)))
        else:  # nothing scores these rows: total 0, as a row where every reward said None
            parts.append((part.rows, Scores({}, [0.0] * len(part.rows), {})))
    return merge(fns, n, parts)


def merge(fns: list[RewardFn], n: int, parts: list[tuple[list[int], Scores]]) -> Scores:
    """One Scores of ``n`` rows from the Scores of disjoint row sets (``(rows, scores)``)."""
    names = [rf.name for rf in fns]
    per_reward: dict[str, list[float | None]] = {name: [None] * n for name in names}
    masked = {name: [False] * n for name in names}
    row_seconds: dict[str, list[float | None]] = {}
    total, errors, seconds = [0.0] * n, {}, {}
    log, failures = RewardLog(), {}
    for rows, part in parts:
        for j, row in enumerate(rows):
            total[row] = part.total[j]
        for name, values in part.per_reward.items():
            _place(per_reward[name], rows, values)
        for name, flags in part.masked.items():
            _place(masked[name], rows, flags)
        for name, values in part.row_seconds.items():
            _place(row_seconds.setdefault(name, [None] * n), rows, values)
        for name, count in part.errors.items():
            errors[name] = errors.get(name, 0) + count
        for name, took in part.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + took
        for column, values in part.logged.columns.items():
            _place(log.columns.setdefault(column, [None] * n), rows, values)
        for metric, values in part.logged.metrics.items():
            log.metrics.setdefault(metric, []).extend(values)
        failures.update(part.failures)
    return Scores(per_reward, total, errors, log, masked, failures, seconds, row_seconds)


def _place(target: list[Any], rows: list[int], values: list[Any]) -> None:
    """``values`` (one per row of ``rows``, or fewer: a log_extra column logged for some) into ``target``."""
    for row, value in zip(rows, values):
        target[row] = value


__all__ = ["Subset", "merge", "score_subsets"]
