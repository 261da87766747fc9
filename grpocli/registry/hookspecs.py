"""The plugin contract of grpo. Third-party distributions implement these hooks.

A plugin is a module listed under the entry-point group ``grpo`` in its distribution's
pyproject.toml::

    [project.entry-points.grpo]
    countdown = "grpo_countdown.plugin"

and holding functions marked ``@grpocli.hookimpl`` whose names are hooks below. Each hook
receives a ``register`` callback; call it once per thing the plugin provides.

grpo calls every hook through pluggy, with keyword arguments, one plugin at a time. pluggy
passes an implementation only the arguments it declares, so an implementation may declare
any subset of its hook's arguments (``def register_rewards(): ...`` is valid), and a hook may
gain arguments in a later grpo without breaking the plugins written before. An implementation
that declares an argument its hook does not have is refused when the plugin loads.
Built-in rewards, datasets, curricula, tools and environments register through these same hooks.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import pluggy

hookspec = pluggy.HookspecMarker("grpo")


class Register(Protocol):
    """The callback a hook receives: ``register(name, fn, description="...")``."""

    def __call__(self, name: str, fn: Callable[..., Any], *, description: str = "") -> None: ...


@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions.

    A reward function has the contract of TRL's GRPOTrainer, so existing ones work unchanged::

        def fn(prompts: list, completions: list, **kwargs) -> list[float | None]

    ``prompts`` and ``completions`` are strings (or chat message lists for conversational
    data); every other dataset column arrives as a keyword argument by name, one value per
    completion, and the recipe's ``[[rewards]] args`` arrive as keyword arguments too. Return
    one float per completion, or None where the reward does not apply. ``async def`` works.
    Names are namespaced by convention: ``"countdown.equation"``.

    The args a reward accepts are its named keyword parameters (other than ``prompts``,
    ``completions`` and ``completion_ids``) plus those it declares with
    ``@grpocli.recipe_args("name", ...)``, which is how a reward that reads an arg through
    ``**kwargs`` says so; a recipe that sets any other arg is refused before a model loads.
    """


@hookspec
def register_datasets(register: Register) -> None:
    """Register dataset loaders.

    A loader is called as ``loader(split=..., seed=..., **args)`` with the recipe's
    ``[data] args`` and returns a ``datasets.Dataset`` (or a list of dicts) with a ``prompt``
    column (a string, or a list of chat messages) and any columns its rewards read.
    """


@hookspec
def register_curricula(register: Register) -> None:
    """Register curriculum (dynamic prompt) functions.

    Called after each generation as ``fn(prompts=..., completions=..., rewards=..., metas=...,
    state=...)`` where ``metas`` are the dataset rows of the prompts and ``state`` a dict the
    function may keep between calls; it returns the rows (dicts with a ``prompt``) to
    generate from next, or None to go on with the dataset's order.
    """


@hookspec
def register_tools(register: Register) -> None:
    """Register tools a recipe can list under ``[[tools]] name = "..."``.

    A tool is a plain typed Python function with a Google-style docstring (a summary line and
    an ``Args:`` entry per parameter), as TRL's ``tools=`` takes them::

        def calculator(expression: str) -> str:
            \"\"\"Evaluate an arithmetic expression.

            Args:
                expression: The expression, e.g. "12 * (3 + 4)".
            \"\"\"

    Its JSON schema (``transformers.utils.get_json_schema``) goes to the chat template; the
    model's calls arrive as keyword arguments; what it returns is turned into the tool message
    with ``str``. An exception or a call past ``multi_turn.tool_timeout`` becomes an error
    message to the model. Calls of one turn run concurrently, in threads.
    """


@hookspec
def register_environments(register: Register) -> None:
    """Register environments a recipe names as ``multi_turn.environment = "..."``.

    An environment is a class (or factory) called with ``[multi_turn] environment_args``; one
    instance per rollout. As TRL's ``environment_factory``: its public methods are tools (typed,
    with docstrings, as for ``register_tools``), ``reset(**row)`` (optional) starts it on the
    rollout's dataset row and may return text appended to the prompt, and ``get_reward()``
    (optional) is what the built-in reward ``environment.reward`` returns when a recipe lists it
    (TRL adds it by itself; grpo scores only the rewards a recipe names). Reward functions receive
    the instances as the ``environments`` keyword, one per completion.
    """
