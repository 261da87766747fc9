"""Checks that need no model: every name in the recipe resolves to a registered plugin entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpocli.errors import UserError
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

    _check_combinations(recipe)
    plugins = load_plugins()
    reward_fns = resolve_rewards(recipe.rewards, plugins.rewards)
    resolve_dataset(recipe.data, plugins.datasets)
    curriculum = None
    if recipe.train.curriculum:
        curriculum = plugins.curricula.get(recipe.train.curriculum, where="train.curriculum").fn
    return Checked(plugins=plugins, reward_fns=reward_fns, curriculum=curriculum)


def _check_combinations(recipe: Recipe) -> None:
    """Options that each validate but do not work together."""
    g, t = recipe.generation, recipe.train
    if g.async_steps and g.backend == "hf":
        raise UserError(
            "generation.async_steps > 0 needs a generation engine apart from the training model",
            where="generation.async_steps", valid="0 with backend 'hf'; any value with 'vllm' or 'vllm-server'",
            hint="set generation.backend = \"vllm\" (or \"vllm-server\"), or generation.async_steps = 0",
        )
    if g.async_steps and (recipe.algorithm.fill_batch or t.curriculum):
        raise UserError(
            "generation.async_steps > 0 cannot be combined with algorithm.fill_batch or train.curriculum "
            "(both choose the next prompts from the last rewards, which async generation has not seen yet)",
            where="generation.async_steps", valid="async_steps = 0, or fill_batch = false and no curriculum",
        )
