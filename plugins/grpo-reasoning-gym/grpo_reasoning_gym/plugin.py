"""The hooks grpo calls: one dataset (``reasoning_gym``) and one reward (``reasoning_gym.score``).

Listed under the entry-point group ``grpo`` in this distribution's pyproject.toml, so
``pip install grpo-reasoning-gym`` is all it takes; ``grpo inspect plugins`` then lists both.
Nothing heavy is imported here: reasoning-gym loads when a recipe uses it.
"""

from __future__ import annotations

import grpocli
from grpo_reasoning_gym.scorer import score
from grpo_reasoning_gym.tasks import load


@grpocli.hookimpl
def register_datasets(register) -> None:
    register(
        "reasoning_gym",
        load,
        description="reasoning-gym procedural tasks; args: task (e.g. basic_arithmetic), size, "
        "and the task's config fields",
    )


@grpocli.hookimpl
def register_rewards(register) -> None:
    register(
        "reasoning_gym.score",
        score,
        description="reasoning-gym's own scorer for the row's task, on the <answer>...</answer> "
        "text (or the whole completion)",
    )
