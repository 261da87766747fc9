"""Checks that need no model: every name in the recipe resolves to a registered plugin entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpocli.recipe import Recipe


@dataclass
class Checked:
    plugins: Any
    reward_fns: list
    curriculum: Any


def preflight(recipe: Recipe) -> Checked:
    """Resolve rewards, dataset and curriculum names; UserError (with did-you-mean) otherwise."""
    from grpocli.data.source import resolve as resolve_dataset
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve as resolve_rewards

    plugins = load_plugins()
    reward_fns = resolve_rewards(recipe.rewards, plugins.rewards)
    resolve_dataset(recipe.data, plugins.datasets)
    curriculum = None
    if recipe.train.curriculum:
        curriculum = plugins.curricula.get(recipe.train.curriculum, where="train.curriculum").fn
    return Checked(plugins=plugins, reward_fns=reward_fns, curriculum=curriculum)
