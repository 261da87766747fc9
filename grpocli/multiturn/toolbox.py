"""A recipe's tools and environment, resolved and checked before any model loads.

A tool is a plain typed Python function with a docstring; its JSON schema comes from the
signature and docstring (``transformers.utils.get_json_schema``, as TRL does) and is what the
chat template shows the model. ``[[tools]] name`` is a registered tool or ``module:function``
(``path/to/file.py:function``), as rewards are named. An environment (``multi_turn.environment``)
is a registered factory or ``module:Class``: one instance per rollout, its public methods are
tools (``reset``, ``get_reward``, ``respond`` and ``get_metrics`` excepted), as TRL's
``environment_factory``; ``respond(messages)`` answers the model's turns without a tool call. Both are checked
against their contracts (``grpocli.registry.hookspecs.Tool``, ``EnvironmentFactory`` and
``Environment``) before any model loads.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.registry.contracts import (
    ENVIRONMENT,
    ENVIRONMENT_RESET,
    ENVIRONMENT_REWARD,
    Resolved,
    check,
    check_tool,
    function_name,
)
from grpocli.registry.hookspecs import ENVIRONMENT_METHODS

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe
    from grpocli.registry import Plugins


@dataclass(frozen=True)
class Tool:
    """A function the model may call, and the JSON schema the chat template shows it."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]


@dataclass
class Toolbox:
    """What a multi-turn recipe calls: standalone tools, and the environment's factory."""

    tools: list[Tool]
    environment: Callable[..., Any] | None = None
    environment_args: dict[str, Any] = field(default_factory=dict)
    environment_tools: list[Tool] = field(default_factory=list)  # from a probe instance: the schemas
    environment_source: Resolved | None = None  # the environment as the recipe named it, for messages
    environment_responds: bool | None = None  # a probe instance has respond() (None: ask the factory)
    environment_timeout: float = 60.0  # seconds a call of its constructor, reset, respond may take

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in (*self.tools, *self.environment_tools)]

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in (*self.tools, *self.environment_tools)]

    @property
    def responds(self) -> bool:
        """Whether the environment answers the model's text turns (has ``respond(messages)``)."""
        if self.environment_responds is not None:
            return self.environment_responds
        return self.environment is not None and callable(getattr(self.environment, "respond", None))

    def new_environment(self) -> Any:
        """A fresh environment instance (None without an environment)."""
        return self.environment(**self.environment_args) if self.environment is not None else None

    def functions(self, environment: Any) -> dict[str, Callable[..., Any]]:
        """The callables of one rollout: the standalone tools, then its environment's methods."""
        out = {t.name: t.fn for t in self.tools}
        if environment is not None:
            out.update({t.name: getattr(environment, t.name) for t in self.environment_tools})
        return out


def tool_from_function(fn: Callable[..., Any], where: str, source: Resolved | None = None) -> Tool:
    """The Tool of a typed, documented function (or bound method); UserError naming what is
    missing, and ``source`` (the plugin or reference that provides it) where given."""
    from transformers.utils import get_json_schema

    source = source or Resolved("tool", getattr(fn, "__name__", repr(fn)), fn)
    check_tool(source, where=where)
    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 (DocstringParsingException, TypeHintParsingException)
        raise UserError(
            f"{source} has no JSON schema: {exc}", where=where,
            valid="a function with a type hint on every parameter and a docstring with a summary line and "
            "an 'Args:' entry per parameter (Google style)",
            hint="add the type hints and the docstring, e.g. def add(a: int, b: int) -> int: \"\"\"Add two "
            "numbers.\\n\\n    Args:\\n        a: The first.\\n        b: The second.\\n    \"\"\"",
        ) from None
    return Tool(schema["function"]["name"], fn, schema)


def open_toolbox(recipe: Recipe, plugins: Plugins) -> Toolbox | None:
    """The recipe's Toolbox, or None for single-turn recipes; UserError for an unknown name, a
    tool without a schema, two tools of one name, or options multi-turn rollouts do not support."""
    mt = recipe.multi_turn
    if not recipe.tools and mt.environment is None:
        return None
    check_combinations(recipe)
    tools = []
    for i, spec in enumerate(recipe.tools):
        tool = _resolve("tool", spec.name, f"tools[{i}].name", plugins.tools)
        tools.append(tool_from_function(tool.fn, f"tools[{i}].name", tool))
    box = Toolbox(tools)
    if mt.environment is not None:
        env = _resolve("environment", mt.environment, "multi_turn.environment", plugins.environments)
        check(env, ENVIRONMENT, where="multi_turn.environment", args=mt.environment_args,
              args_where="multi_turn.environment_args")
        box.environment, box.environment_args, box.environment_source = env.fn, dict(mt.environment_args), env
        box.environment_timeout = mt.environment_timeout
        probe = _probe(box)
        box.environment_responds = callable(getattr(probe, "respond", None))
        box.environment_tools = [tool_from_function(getattr(probe, name), "multi_turn.environment",
                                                    env.at(name, getattr(probe, name)))
                                 for name in environment_methods(probe)]
    _check_unique(box)
    return box


def check_environment(box: Toolbox, columns: list[str]) -> None:
    """A fresh environment's ``reset`` (called with every column of the row) and ``get_reward``
    (with nothing) against their contract; both are optional. UserError naming the method and
    the parameter that does not fit."""
    if box.environment is None:
        return
    env = _probe(box)
    source = box.environment_source or Resolved("environment", function_name(box.environment), box.environment)
    for name, contract in (("reset", ENVIRONMENT_RESET), ("get_reward", ENVIRONMENT_REWARD)):
        method = getattr(env, name, None)
        if callable(method):
            check(source.at(name, method), contract, where="multi_turn.environment",
                  columns=columns if name == "reset" else None)
    _check_respond(env, source)


def _check_respond(env: Any, source: Resolved) -> None:
    """``respond`` (optional) takes the conversation as its one argument (hookspecs.Environment)."""
    method = getattr(env, "respond", None)
    if not callable(method):
        return
    try:
        inspect.signature(method).bind([])
    except (TypeError, ValueError):
        raise UserError(f"{source.at('respond', method)} cannot be called as respond(messages)",
                        where="multi_turn.environment", valid="def respond(self, messages) -> str | None: the next "
                        "user message, or None to end the rollout", hint="give respond exactly one parameter, messages"
                        ) from None


def environment_methods(env: Any) -> list[str]:
    """The names of an environment's tool methods: its public functions but ENVIRONMENT_METHODS."""
    return [name for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ENVIRONMENT_METHODS]


def check_combinations(recipe: Recipe) -> None:
    """Options that work single-turn but not with multi-turn rollouts (yet): refused with why."""
    g, why = recipe.generation, None
    if g.async_steps:
        why = ("generation.async_steps",
               "generating ahead would need the turn loop (tools included) in the background prefetcher",
               "generation.async_steps = 0")
    elif g.pipeline == "inflight":
        why = ("generation.pipeline",
               "in-flight generation would need the turn loop (tools included) on the engine's thread",
               "generation.pipeline = \"sync\"")
    elif recipe.data.chat_template == "never":
        why = ("data.chat_template",
               "tool calls and results are chat messages: prompts need the chat template",
               "data.chat_template = \"always\" (\"auto\" is read as \"always\" with tools)")
    if why is not None:
        key, reason, fix = why
        raise UserError(f"{key} is not supported with [[tools]] / multi_turn.environment: {reason}",
                        where=key, valid=fix, hint=f"set {fix}, or remove the tools")


def _resolve(kind: str, name: str, where: str, registry: Any) -> Resolved:
    """A registered entry, an environment package's (verifiers:ENV_ID, openenv:module:Class),
    else module:function / file.py:function."""
    if kind == "environment" and name.startswith(("verifiers:", "openenv:")):
        from grpocli.multiturn.environment_packages import factory_for

        return Resolved(kind, name, factory_for(name, where))
    if name in registry or ":" not in name:
        return Resolved.of(kind, registry.get(name, where=where))
    from grpocli.rewards.references import _function

    return Resolved(kind, name, _function(name, where).fn)


def _probe(box: Toolbox) -> Any:
    """One instance, made as the turn loop makes them (bounded by multi_turn.environment_timeout; an
    exception, sys.exit or os._exit in the constructor named)."""
    from grpocli.multiturn.environment_calls import EnvironmentCalls

    calls = EnvironmentCalls(str(box.environment_source or "environment"), box.environment_timeout)
    return calls.new(box.new_environment)


def _check_unique(box: Toolbox) -> None:
    names = box.tool_names
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"two tools are named {repeated[0]!r} (the model calls tools by name)",
                        where="tools", valid="distinct function names over [[tools]] and the environment's methods",
                        hint="remove one of them, or rename the function")
