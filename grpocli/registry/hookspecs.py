"""The plugin contract of grpo: the hooks a plugin implements, and what it registers through them.

A plugin is a module listed under the entry-point group ``grpo`` in its distribution's
pyproject.toml::

    [project.entry-points.grpo]
    countdown = "grpo_countdown.plugin"

and holding functions marked ``@grpocli.hookimpl`` whose names are hooks below. Each hook
receives a ``register`` callback; call it once per thing the plugin provides:
``register("countdown.equation", fn, description="...")``. Names are namespaced by convention.

What each registered thing must look like is the Protocol of its kind, below the hooks:
``RewardFunction``, ``DatasetLoader``, ``Curriculum``, ``Tool``, ``EnvironmentFactory`` and
``Environment``. Their docstrings say what grpo passes (always by keyword) and what to return.
``grpo train`` (``--dry-run`` too) checks every callable a recipe uses against its Protocol
before any model loads: a parameter grpo never passes, or a keyword grpo passes that the
callable does not take, is refused (exit 2) naming the plugin, the function and the parameter.
A recipe may also name a reward, tool or environment as ``module:function`` (or
``path/to/file.py:function``); the same Protocols apply.

grpo calls every hook through pluggy, with keyword arguments, one plugin at a time. pluggy
passes an implementation only the arguments it declares, so an implementation may declare
any subset of its hook's arguments (``def register_rewards(): ...`` is valid), and a hook may
gain arguments in a later grpo without breaking the plugins written before. An implementation
that declares an argument its hook does not have is refused when the plugin loads.
Built-in rewards, datasets, curricula, tools and environments register through these same hooks.

Light module (typing and pluggy only): ``import grpocli`` and ``grpo --help`` import it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pluggy

hookspec = pluggy.HookspecMarker("grpo")


class Register(Protocol):
    """The callback a hook receives: ``register(name, fn, description="...")``.

    ``description`` defaults to the first line of ``fn``'s docstring; `grpo inspect plugins`
    shows it. A name registered twice (by any two plugins) is an error naming both.
    """

    def __call__(self, name: str, fn: Callable[..., Any], *, description: str = "") -> None: ...


# -- hooks ---------------------------------------------------------------------------------
@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions (``RewardFunction``), named as ``[[rewards]] name`` in recipes."""


@hookspec
def register_datasets(register: Register) -> None:
    """Register dataset loaders (``DatasetLoader``), named as ``data.dataset`` in recipes."""


@hookspec
def register_curricula(register: Register) -> None:
    """Register curricula (``Curriculum``), named as ``train.curriculum`` in recipes."""


@hookspec
def register_tools(register: Register) -> None:
    """Register tools (``Tool``), named as ``[[tools]] name`` in recipes."""


@hookspec
def register_environments(register: Register) -> None:
    """Register environments (``EnvironmentFactory``), named as ``multi_turn.environment``."""


# -- what a plugin registers ---------------------------------------------------------------
class RewardFunction(Protocol):
    """Scores a batch of completions; TRL GRPOTrainer's contract, so TRL reward functions work.

    ::

        def fn(prompts, completions, **kwargs) -> list[float | None]

    Called with keywords, one value per completion in each (a prompt repeats for its G
    completions): ``prompts`` and ``completions`` (strings, or chat message lists when the
    prompt is one: then each completion is the conversation after the prompt), and also
    ``completion_ids`` (token ids), ``trainer_state`` (a ``transformers.TrainerState``),
    ``log_extra(column, values)`` and ``log_metric(name, value)``, grpo's own
    ``log_row_seconds(values)`` (the wall seconds each completion took, None where not measured:
    grpocli.rewards.timings; only to a reward that names it, never through ``**kwargs``), every
    dataset column by its name, ``environments`` (one instance per completion) with ``multi_turn.environment``, and
    the recipe's ``[[rewards]] args``. grpo passes only the keywords the function names, or
    all of them to one that takes ``**kwargs``: declare what you read.

    Every parameter without a default must be one of those. The args a reward accepts are its
    named parameters (other than the keywords above) plus the names it declares with
    ``@grpocli.recipe_args("name", ...)``, which is how a reward that reads an arg through
    ``**kwargs`` says so; a recipe that sets any other arg is refused.

    Return one float per completion, or None where the reward does not apply (counted as 0).
    ``async def`` works; calls of one step run concurrently.
    """

    def __call__(self, prompts: list[Any], completions: list[Any], *, completion_ids: list[list[int]],
                 trainer_state: Any, log_extra: Callable[[str, list[Any]], None],
                 log_metric: Callable[[str, float], None], log_row_seconds: Callable[[list[float | None]], None],
                 **columns_and_args: Any) -> Sequence[float | None]: ...


class DatasetLoader(Protocol):
    """Loads one split of a dataset.

    ::

        def loader(split, seed, **args) -> datasets.Dataset | list[dict]

    Called as ``loader(split=..., seed=..., **args)``: ``split`` is ``data.split`` (or
    ``data.eval_split``), ``seed`` is ``train.seed`` (for generated data), and the recipe's
    ``[data] args`` arrive as keyword arguments. Take ``split`` and ``seed`` by name (or
    through ``**kwargs``); every other parameter needs a default or a ``data.args`` entry, and
    a ``data.args`` key the loader does not name is refused unless it takes ``**kwargs``.

    Return a ``datasets.Dataset`` (one split) or a list of dicts, with a ``prompt`` column (a
    string, or a list of chat messages) and any columns its rewards read.
    """

    def __call__(self, *, split: str, seed: int, **args: Any) -> Any: ...


class Curriculum(Protocol):
    """Picks the prompts of the next step from how the last ones scored.

    ::

        def fn(*, prompts, completions, rewards, metas, state, batch_size, next_rows, **args)
            -> list[dict] | None

    Called after each generation, with keywords only (take them all, by name or through
    ``**kwargs``):

    ``prompts``      list, one per prompt just generated, as reward functions get them
    ``completions``  list[list], the G completions of each prompt
    ``rewards``      list[list[float | None]], the total reward of each completion, per prompt
    ``metas``        list[dict], the dataset rows the prompts came from (all columns, and
                     ``prompt_text``: the prompt as the model saw it)
    ``state``        dict kept between calls and saved in checkpoints: JSON values only
    ``batch_size``   how many rows to return
    ``next_rows``    iterator over the rows the dataset would give next; the dataset's position
                     advances by exactly the rows taken from it

    The recipe's ``train.curriculum_args`` arrive as more keywords: the args a curriculum
    accepts are its named parameters with defaults plus those it declares with
    ``@grpocli.recipe_args("name", ...)``; any other is refused, as for rewards.

    Return ``batch_size`` rows to generate from next (rows of ``metas`` or of ``next_rows``, or
    new dicts with the dataset's columns: grpo renders those without ``prompt_text``), or None
    to take the next ``batch_size`` rows of the dataset.
    """

    def __call__(self, *, prompts: list[Any], completions: list[list[Any]], rewards: list[list[float | None]],
                 metas: list[dict[str, Any]], state: dict[str, Any], batch_size: int,
                 next_rows: Iterator[dict[str, Any]], **args: Any) -> list[dict[str, Any]] | None: ...


class Tool(Protocol):
    """A function the model may call in multi-turn rollouts, as TRL's ``tools=`` takes them.

    A plain function with a type hint on every parameter and a Google-style docstring (a
    summary line and an ``Args:`` entry per parameter)::

        def calculator(expression: str) -> str:
            \"\"\"Evaluate an arithmetic expression.

            Args:
                expression: The expression, e.g. "12 * (3 + 4)".
            \"\"\"

    Its JSON schema (``transformers.utils.get_json_schema``) goes to the chat template. The
    model's call arrives as keyword arguments, so no parameter may be positional-only or
    ``*args``. What it returns becomes the tool message (``str``); an exception or a call past
    ``multi_turn.tool_timeout`` becomes an error message to the model. Calls of one turn run
    concurrently, in threads.
    """

    def __call__(self, **arguments: Any) -> Any: ...


class Environment(Protocol):
    """One rollout's environment, as TRL's ``environment_factory`` makes them.

    Its public methods other than ``reset``, ``get_reward``, ``respond`` and ``get_metrics`` are
    tools (each a ``Tool``: typed, documented, called by keyword), called one at a time in the
    order the model wrote them. All four methods below are optional. Reward functions receive the instances as the
    ``environments`` keyword, one per completion, as the rollouts left them.
    """

    def reset(self, **row: Any) -> str | None:
        """Start on the rollout's dataset row: every column (``prompt`` too) arrives as a
        keyword, so take the ones you read by name and the rest through ``**kwargs``. Text it
        returns is appended to the prompt; it must be the same for every rollout of a prompt."""

    def get_reward(self) -> float:
        """Called with no arguments; what the built-in reward ``environment.reward`` returns
        for this rollout when a recipe lists it (TRL adds it by itself; grpo does not)."""

    def respond(self, messages: list[dict[str, Any]]) -> str | None:
        """Called after each model turn without a tool call, with the conversation so far (the
        prompt's messages, then the rollout's: the last is that turn's assistant message). The
        text returned is the next user message (feedback, a new observation: verl's
        ``Interaction.generate_response``, verifiers' ``env_response``); None ends the rollout
        (verifiers' ``is_completed``). On the rollout's last turn it is still called, so the
        environment sees the final answer, and what it returns is dropped."""

    def get_metrics(self) -> dict[str, float]:
        """Called once the rollout is over; each value is averaged over the rollouts and logged as
        ``env/<name>`` (in metrics.jsonl, and ``eval/env/<name>`` in evaluations). Every
        environment should return the same names."""


class EnvironmentFactory(Protocol):
    """Makes an ``Environment``: usually the class itself.

    Called as ``factory(**environment_args)`` with the recipe's ``[multi_turn]
    environment_args``, once per rollout, and before training to read the tools' schemas and
    check the methods. Every parameter without a default needs an ``environment_args`` entry, and an
    ``environment_args`` key it does not name is refused unless it takes ``**kwargs``.
    """

    def __call__(self, **environment_args: Any) -> Environment: ...


def keywords(protocol: type) -> tuple[str, ...]:
    """The keywords grpo passes on every call of ``protocol``'s kind: its ``__call__``'s named
    parameters. The Protocol's signature is the one place they are written down."""
    params = list(inspect.signature(protocol.__call__).parameters.values())[1:]  # self
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


#: What every reward gets besides the dataset columns, environments and args (TRL 1.16's keywords, and
#: grpo's log_row_seconds).
REWARD_KEYWORDS = keywords(RewardFunction)
#: What every dataset loader gets besides ``data.args``.
DATASET_KEYWORDS = keywords(DatasetLoader)
#: What every curriculum gets besides ``train.curriculum_args``.
CURRICULUM_KEYWORDS = keywords(Curriculum)
#: Environment methods that are not tools.
ENVIRONMENT_METHODS = ("reset", "get_reward", "respond", "get_metrics")
