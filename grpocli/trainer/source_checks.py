"""Preflight of a weighted mixture ([[data.sources]]): what each source names and what its rows can feed,
checked before any model loads, each UserError naming the source as ``data.sources[1] ("gsm8k")``.

In this order, cheapest first: the rewards each source lists are rewards of the recipe; each source's
loader resolves and takes its args; each training split loads and has rows (and, with eval.every, a
local source's eval split); each reward that scores a source can be called with that source's columns
(its required keyword arguments are columns the source has, as the single-dataset preflight checks them
against data.dataset's; a built-in's columns read through **kwargs, ``reads_columns``, are among them), and a
multi-turn environment can reset from its rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError, did_you_mean
from grpocli.recipe.data_sources import reward_indices, unknown_rewards, where

if TYPE_CHECKING:
    from grpocli.multiturn.toolbox import Toolbox
    from grpocli.recipe import Recipe
    from grpocli.registry import Plugins
    from grpocli.rewards import RewardFn


def check_sources(recipe: Recipe, plugins: Plugins, reward_fns: list[RewardFn],
                  toolbox: Toolbox | None = None) -> list[Any]:
    """The training split of each source (datasets.Dataset, in recipe order), every source checked."""
    from grpocli.data.source import in_source, load_source, resolve

    data = recipe.data
    names, labels = [spec.name for spec in recipe.rewards], [rf.name for rf in reward_fns]
    for i, source in enumerate(data.sources):
        _check_reward_names(i, source, names, labels)
    for i, source in enumerate(data.sources):
        try:
            resolve(source.section(data), plugins.datasets)
        except UserError as exc:
            raise in_source(exc, i, source.label) from None
    loaded = [load_source(data, i, plugins.datasets, None, recipe.train.seed) for i in range(len(data.sources))]
    for i, source in enumerate(data.sources):
        _check_eval_split(recipe, plugins, i)
        columns = sorted(set(loaded[i].column_names) | {"prompt"})  # a row as the trainer hands it on
        if toolbox is not None:
            _named(i, source.label, lambda: _check_environment(toolbox, columns))
        _check_feeds(recipe, plugins, reward_fns, i, list(loaded[i].column_names))
    return loaded


def _check_reward_names(i: int, source: Any, names: list[str], labels: list[str]) -> None:
    unknown = unknown_rewards(source, names, labels)
    if unknown:
        known = list(dict.fromkeys([*names, *labels]))
        raise UserError(
            f"rewards names {unknown[0]!r}, which is none of the recipe's [[rewards]]{did_you_mean(unknown[0], known)}",
            where=f"{where(i, source.label)}.rewards", valid=f"names of [[rewards]] entries: {', '.join(known)}",
            hint="add a [[rewards]] entry of that name, or leave it out of the source's rewards "
            "(no rewards key: every reward scores the source)")


def _check_eval_split(recipe: Recipe, plugins: Plugins, i: int) -> None:
    """With eval.every, a local source's held-out split loads now (as the single dataset's, grpocli.trainer.preflight)."""
    from grpocli.data.source import load_source, resolve

    source = recipe.data.sources[i]
    section = source.section(recipe.data)
    split = source.eval_split or recipe.eval.split_for(recipe.data.eval_split)
    if recipe.eval.every and split != section.split and resolve(section, plugins.datasets)[0].name == "local":
        load_source(recipe.data, i, plugins.datasets, split, recipe.train.seed)


def _check_feeds(recipe: Recipe, plugins: Plugins, reward_fns: list[RewardFn], i: int, column_names: list[str]) -> None:
    """Every reward that scores source ``i`` can be called with its columns (the single dataset's check,
    grpocli.trainer.preflight, on this source's columns and with its prompt column)."""
    from grpocli.registry.contracts import Resolved
    from grpocli.rewards.arguments import check_columns_read, check_reward_signature

    source = recipe.data.sources[i]
    prompt_column = source.section(recipe.data).prompt_column
    env_column = ["environments"] if recipe.multi_turn.environment else []
    columns = sorted((set(column_names) | {"prompt"} | set(env_column)) - {prompt_column})  # as the loop passes them
    names, labels = [spec.name for spec in recipe.rewards], [rf.name for rf in reward_fns]
    for k in reward_indices(source, names, labels):
        spec, rf = recipe.rewards[k], reward_fns[k]
        if spec.url is not None:  # served: its server calls it (grpocli.reward_server)
            continue
        reward = (Resolved.of("reward", plugins.rewards.get(spec.name)) if spec.name in plugins.rewards
                  else Resolved("reward", spec.name, rf.fn))
        _named(i, source.label, lambda k=k, reward=reward, rf=rf: check_reward_signature(k, reward, rf.args, columns),
               also=f"reward {rf.name!r} scores this source's rows")
        _named(i, source.label, lambda k=k, rf=rf: check_columns_read(k, rf.name, rf.fn, rf.args, columns),
               also=f"reward {rf.name!r} scores this source's rows")


def _check_environment(toolbox: Toolbox, columns: list[str]) -> None:
    from grpocli.multiturn.toolbox import check_environment

    check_environment(toolbox, columns)


def _named(i: int, name: str, check: Any, also: str = "") -> None:
    """Run ``check``; its UserError says the source it is about (and ``also``, what links them)."""
    try:
        check()
    except UserError as exc:
        said = f"{exc.what} ({also}; set the source's rewards to those its columns feed)" if also else exc.what
        raise UserError(said, where=f"{where(i, name)}: {exc.where}" if exc.where else where(i, name),
                        valid=exc.valid, hint=exc.hint) from None


__all__ = ["check_sources"]
