"""reasoning-gym tasks as a grpo dataset: ``loader(split, seed, task=..., size=..., **config)``.

Follows reasoning-gym's factory (``reasoning_gym.create_dataset(task, seed=, size=, **config)``);
every entry is generated procedurally from (task, config, seed, index), offline.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from functools import lru_cache
from typing import Any

from grpocli.errors import UserError, did_you_mean

DEFAULT_SIZE = 500


def load(split: str = "train", seed: int = 0, task: str | None = None, size: int = DEFAULT_SIZE, **config: Any):
    """Generate ``size`` entries of one reasoning-gym task as a ``datasets.Dataset``.

    Columns: ``prompt`` (the question), ``answer``, ``rg_task``, ``rg_entry`` (the whole entry,
    metadata included, as JSON), ``rg_config`` (the create_dataset keyword arguments, as JSON)
    and ``rg_index`` (the entry's index), which ``reasoning_gym.score`` reads.
    """
    import datasets

    task = task_name(task, where="data.args.task")
    if not isinstance(size, int) or size < 1:
        raise UserError(f"size must be a positive integer, got {size!r}", where="data.args.size")
    rg_config = {**config, "seed": split_seed(seed, split), "size": size}
    dataset = create(task, rg_config)
    config_json = json.dumps(rg_config, sort_keys=True)
    rows = []
    for index in range(size):
        entry = dataset[index]
        rows.append(
            {
                "prompt": entry["question"],
                "answer": None if entry.get("answer") is None else str(entry["answer"]),
                "rg_task": task,
                "rg_entry": json.dumps(entry, default=_jsonable),
                "rg_config": config_json,
                "rg_index": index,
            }
        )
    return datasets.Dataset.from_list(rows)


def split_seed(seed: int, split: str) -> int:
    """A generator seed per (seed, split), stable across processes, so train and test differ."""
    return zlib.crc32(f"{seed}:{split}".encode())


@lru_cache(maxsize=1)
def task_names() -> tuple[str, ...]:
    """Every task name reasoning-gym registers (its factory's DATASETS table)."""
    import reasoning_gym  # noqa: F401  (importing it fills the table)
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(DATASETS))


def task_name(task: object, *, where: str) -> str:
    """``task`` if reasoning-gym knows it, else a UserError listing the valid names."""
    names = task_names()
    if isinstance(task, str) and task in names:
        return task
    what = (
        "the reasoning_gym dataset needs a task"
        if task is None
        else f"unknown reasoning-gym task {task!r}{did_you_mean(str(task), names)}"
    )
    raise UserError(
        what,
        where=where,
        valid=", ".join(names),
        hint='set data.args = {task = "basic_arithmetic", size = 1000} (any valid name above)',
    )


def create(task: str, rg_config: dict[str, Any]):
    """``reasoning_gym.create_dataset(task, **rg_config)``; a bad config field is a UserError."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    fields = [f.name for f in dataclasses.fields(DATASETS[task][1])]
    for key in rg_config:
        if key not in fields:
            raise UserError(
                f"reasoning-gym task {task!r} has no config field {key!r}{did_you_mean(key, fields)}",
                where=f"data.args.{key}",
                valid="task, size, " + ", ".join(f for f in fields if f not in ("seed", "size")),
                hint=f"drop data.args.{key}, or pick a field from the list",
            )
    try:
        return reasoning_gym.create_dataset(task, **rg_config)
    except (AssertionError, ValueError, TypeError) as exc:
        raise UserError(
            f"reasoning-gym rejected the config of task {task!r}: {exc or type(exc).__name__}",
            where="data.args",
            valid=", ".join(f for f in fields if f not in ("seed", "size")),
            hint="see the task's config dataclass in reasoning_gym for each field's bounds",
        ) from None


def _jsonable(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)
