"""The reward ``reasoning_gym.score``: reasoning-gym's own ``score_answer`` for each row's task.

Follows reasoning-gym's training integration: the answer is the text of the last
``<answer>...</answer>`` (``reasoning_gym.utils.extract_answer``), and the entry is regenerated
from (task, config, index) so its metadata has exactly the types the scorer expects (JSON turns
tuples into lists, which e.g. arc_agi's scorer compares against). Where the regenerated entry
does not match the row (a non-deterministic task, or rows without rg_config), the row's
``rg_entry`` is scored as it is.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import grpocli
from grpo_reasoning_gym.tasks import create, task_name
from grpocli.errors import UserError


@grpocli.recipe_args("strict")
def score(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """reasoning-gym's score of each completion's answer (1.0: correct); TRL's reward contract.

    Reads the columns ``rg_task`` and ``rg_entry`` (and ``rg_config``, ``rg_index`` where
    present) that the ``reasoning_gym`` dataset makes, through ``**kwargs``. Its one
    ``[[rewards]] args`` key, declared with ``@grpocli.recipe_args``, is ``strict``: ``strict =
    true`` scores a completion without an ``<answer>...</answer>`` tag 0.0 instead of scoring
    its whole text. grpo refuses any other key.
    """
    from reasoning_gym.utils import extract_answer

    rg_task, rg_entry = _column(kwargs, "rg_task"), _column(kwargs, "rg_entry")
    rg_config, rg_index = kwargs.get("rg_config"), kwargs.get("rg_index")
    strict = bool(kwargs.get("strict", False))
    scores = []
    for row, completion in enumerate(completions):
        where = f"reward reasoning_gym.score, row {row}"
        task = task_name(rg_task[row], where=f"{where}, column rg_task")
        entry = _row_entry(rg_entry[row], where)
        config = rg_config[row] if rg_config else None
        index = rg_index[row] if rg_index else None
        text = _text(completion)
        answer = extract_answer(text)
        if answer is None and not strict:
            answer = text.strip()
        fn, entry = _scorer(task, config, index, entry)
        scores.append(0.0 if answer is None else float(fn(answer, entry)))
    return scores


def _scorer(task: str, config: str | None, index: int | None, entry: dict) -> tuple[Any, dict]:
    if config is None:
        return _dataset(task, None).score_answer, entry
    dataset = _dataset(task, config)
    if index is not None:
        original = _entry(task, config, index)
        if original.get("question") == entry.get("question"):
            return dataset.score_answer, original
    return dataset.score_answer, entry


@lru_cache(maxsize=64)
def _dataset(task: str, config: str | None):
    return create(task, json.loads(config) if config else {})


@lru_cache(maxsize=4096)
def _entry(task: str, config: str, index: int) -> dict:
    return _dataset(task, config)[index]


def _column(kwargs: dict[str, Any], name: str) -> list:
    if kwargs.get(name) is None:
        present = ", ".join(sorted(k for k in kwargs if k != "strict")) or "(none)"
        raise UserError(
            f"reward reasoning_gym.score needs the column {name!r}, which the batch does not have",
            valid=f"columns present: {present}",
            hint='use data.dataset = "reasoning_gym", whose rows carry rg_task and rg_entry',
        )
    return kwargs[name]


def _row_entry(value: object, where: str) -> dict:
    if isinstance(value, dict):
        return value
    try:
        entry = json.loads(value)
    except (TypeError, ValueError):
        entry = None
    if not isinstance(entry, dict) or "answer" not in entry:
        raise UserError(
            f"column rg_entry holds {str(value)[:80]!r}, not a reasoning-gym entry",
            where=where,
            valid='a JSON object {"question": ..., "answer": ..., "metadata": {...}}',
            hint='use data.dataset = "reasoning_gym", whose rows carry rg_entry',
        )
    return entry


def _text(completion: object) -> str:
    """The completion's text: a string, or the content of the last chat message."""
    if isinstance(completion, list) and completion:
        return str(completion[-1].get("content", ""))
    return str(completion)
