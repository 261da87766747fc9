"""Built-in curricula: functions that pick the next prompts from how the last ones scored.

Each has the curriculum contract, ``grpocli.registry.hookspecs.Curriculum``: called by keyword
with ``prompts, completions, rewards, metas, state, batch_size, next_rows`` and the recipe's
``train.curriculum_args``, it returns ``batch_size`` rows to generate from next (rows of
``metas`` or ``next_rows``; rows without ``prompt_text`` are rendered by the trainer), or None
to take the dataset's next rows. ``state`` is saved in checkpoints: JSON values only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import grpocli
from grpocli.errors import UserError


def replay_unsolved(
    *,
    rewards: list[list[float | None]],
    metas: list[dict[str, Any]],
    state: dict[str, Any],
    batch_size: int,
    next_rows: Iterator[dict[str, Any]],
    threshold: float = 0.5,
    replay_fraction: float = 0.25,
    max_replays: int = 3,
    pool_size: int = 1024,
    **_: Any,
) -> list[dict[str, Any]] | None:
    """Replay prompts whose mean reward stayed below ``threshold`` in part of each next batch.

    A prompt that scores below ``threshold`` joins a pool (at most ``pool_size``, the oldest
    leave first); each batch is ``replay_fraction`` pool prompts, least recently replayed
    first, and fresh dataset rows. A prompt leaves the pool once it scores ``>= threshold`` or
    when its ``max_replays``-th replay scores below it too. Rewards of None are left out of
    the mean; a prompt with no rewards at all is skipped.
    """
    _check_fraction("replay_fraction", replay_fraction)
    pool = {entry["key"]: entry for entry in state.get("pool", [])}  # insertion order = age
    for meta, scores in zip(metas, rewards, strict=True):
        mean = _mean(scores)
        if mean is None:
            continue
        key = row_key(meta)
        entry = pool.get(key)
        if mean >= threshold or (entry is not None and entry["replays"] >= max_replays):
            pool.pop(key, None)  # solved, or its last replay failed too
        elif entry is None:
            pool[key] = {"key": key, "row": dict(meta), "replays": 0}
    for key in list(pool)[: max(0, len(pool) - pool_size)]:
        del pool[key]
    ready = [entry for entry in pool.values() if entry["replays"] < max_replays]
    picked = ready[: round(replay_fraction * batch_size)]
    for entry in picked:  # to the back of the queue
        entry["replays"] += 1
        pool[entry["key"]] = pool.pop(entry["key"])
    state["pool"] = list(pool.values())
    state["replayed"] = state.get("replayed", 0) + len(picked)
    if not picked:
        return None
    fresh = list(itertools.islice(next_rows, batch_size - len(picked)))
    return [entry["row"] for entry in picked] + fresh


def skip_solved(
    *,
    rewards: list[list[float | None]],
    metas: list[dict[str, Any]],
    state: dict[str, Any],
    batch_size: int,
    next_rows: Iterator[dict[str, Any]],
    threshold: float = 1.0,
    max_skip_factor: int = 8,
    **_: Any,
) -> list[dict[str, Any]] | None:
    """Leave out of later epochs the prompts whose mean reward reached ``threshold``.

    As open-instruct's ``no_resampling_pass_rate``: solved prompts teach nothing (zero spread).
    Looks at most ``max_skip_factor x batch_size`` rows ahead; when too few unsolved rows are
    found there, the batch is topped up with solved ones so that it is always full.
    """
    solved = set(state.get("solved", []))
    for meta, scores in zip(metas, rewards, strict=True):
        mean = _mean(scores)
        if mean is not None and mean >= threshold:
            solved.add(row_key(meta))
    state["solved"] = sorted(solved)
    if not solved:
        return None
    batch: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for row in itertools.islice(next_rows, max(1, max_skip_factor) * batch_size):
        (skipped if row_key(row) in solved else batch).append(row)
        if len(batch) == batch_size:
            break
    state["skipped"] = state.get("skipped", 0) + len(skipped)
    return batch + skipped[: batch_size - len(batch)]


def row_key(row: dict[str, Any]) -> str:
    """A short stable identity of a row: a hash of what the model sees (or of its prompt)."""
    text = row.get("prompt_text")
    if not isinstance(text, str):
        text = json.dumps(row.get("prompt"), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _mean(scores: list[float | None]) -> float | None:
    values = [s for s in scores if s is not None]
    return sum(values) / len(values) if values else None


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise UserError(
            f"{name} = {value!r} is out of range",
            where=f"train.curriculum_args.{name}",
            valid="a number from 0 to 1",
        )


@grpocli.hookimpl
def register_curricula(register) -> None:
    register(
        "replay_unsolved",
        replay_unsolved,
        description="Mix prompts whose mean reward stayed below a threshold back into later "
        "batches; args threshold (0.5), replay_fraction (0.25), max_replays (3), pool_size.",
    )
    register(
        "skip_solved",
        skip_solved,
        description="Skip prompts already solved (mean reward >= threshold, 1.0) in later "
        "epochs, as open-instruct's no_resampling_pass_rate; args threshold, max_skip_factor.",
    )
