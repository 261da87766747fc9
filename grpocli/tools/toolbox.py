"""A recipe's tools and environment, resolved and checked before any model loads.

A tool is a plain typed Python function with a docstring; its JSON schema comes from the
signature and docstring (``transformers.utils.get_json_schema``, as TRL does) and is what the
chat template shows the model. ``[[tools]] name`` is a registered tool or ``module:function``
(``path/to/file.py:function``), as rewards are named. An environment (``multi_turn.environment``)
is a registered factory or ``module:Class``: one instance per rollout, its public methods are
tools (``reset`` and ``get_reward`` excepted), as TRL's ``environment_factory``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpocli.errors import UserError

#: Environment methods that are not tools.
ENVIRONMENT_HOOKS = ("reset", "get_reward")


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

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in (*self.tools, *self.environment_tools)]

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in (*self.tools, *self.environment_tools)]

    def new_environment(self) -> Any:
        """A fresh environment instance (None without an environment)."""
        return self.environment(**self.environment_args) if self.environment is not None else None

    def functions(self, environment: Any) -> dict[str, Callable[..., Any]]:
        """The callables of one rollout: the standalone tools, then its environment's methods."""
        out = {t.name: t.fn for t in self.tools}
        if environment is not None:
            out.update({t.name: getattr(environment, t.name) for t in self.environment_tools})
        return out


def tool_from_function(fn: Callable[..., Any], where: str) -> Tool:
    """The Tool of a typed, documented function (or bound method); UserError naming what is missing."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 (DocstringParsingException, TypeHintParsingException)
        raise UserError(
            f"tool {getattr(fn, '__name__', fn)!r} has no JSON schema: {exc}", where=where,
            valid="a function with a type hint on every parameter and a docstring with a summary line and "
            "an 'Args:' entry per parameter (Google style)",
            hint="add the type hints and the docstring, e.g. def add(a: int, b: int) -> int: \"\"\"Add two "
            "numbers.\\n\\n    Args:\\n        a: The first.\\n        b: The second.\\n    \"\"\"",
        ) from None
    return Tool(schema["function"]["name"], fn, schema)


def open_toolbox(recipe: Any, plugins: Any) -> Toolbox | None:
    """The recipe's Toolbox, or None for single-turn recipes; UserError for an unknown name, a
    tool without a schema, two tools of one name, or options multi-turn rollouts do not support."""
    mt = recipe.multi_turn
    if not recipe.tools and mt.environment is None:
        return None
    check_combinations(recipe)
    tools = [tool_from_function(_resolve(spec.name, f"tools[{i}].name", plugins.tools), f"tools[{i}].name")
             for i, spec in enumerate(recipe.tools)]
    box = Toolbox(tools)
    if mt.environment is not None:
        box.environment = _resolve(mt.environment, "multi_turn.environment", plugins.environments)
        box.environment_args = dict(mt.environment_args)
        probe = _probe(box)
        box.environment_tools = [tool_from_function(getattr(probe, name), "multi_turn.environment")
                                 for name in environment_methods(probe)]
    _check_unique(box)
    return box


def environment_methods(env: Any) -> list[str]:
    """The names of an environment's tool methods: its public functions but reset and get_reward."""
    return [name for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ENVIRONMENT_HOOKS]


def check_combinations(recipe: Any) -> None:
    """Options that work single-turn but not with multi-turn rollouts (yet): refused with why."""
    g, why = recipe.generation, None
    if g.async_steps:
        why = ("generation.async_steps",
               "generating ahead would need the turn loop (tools included) in the background prefetcher",
               "generation.async_steps = 0")
    elif recipe.eval.every:
        why = ("eval.every",
               ("evaluation samples single-turn completions, without the tools the model is trained to call: "
                "its scores would mislead"), "eval.every = 0")
    elif recipe.data.chat_template == "never":
        why = ("data.chat_template",
               "tool calls and results are chat messages: prompts need the chat template",
               "data.chat_template = \"always\" (\"auto\" is read as \"always\" with tools)")
    if why is not None:
        key, reason, fix = why
        raise UserError(f"{key} is not supported with [[tools]] / multi_turn.environment: {reason}",
                        where=key, valid=fix, hint=f"set {fix}, or remove the tools")


def _resolve(name: str, where: str, registry: Any) -> Callable[..., Any]:
    """A registered entry, else module:function / file.py:function."""
    if name in registry or ":" not in name:
        return registry.get(name, where=where).fn
    from grpocli.rewards.references import _function

    return _function(name, where).fn


def _probe(box: Toolbox) -> Any:
    try:
        return box.new_environment()
    except Exception as exc:  # noqa: BLE001 (the user's constructor: named in the error)
        raise UserError(
            f"the environment could not be made: {type(exc).__name__}: {exc}", where="multi_turn.environment",
            valid="a class or factory that takes [multi_turn] environment_args as keyword arguments",
            hint="check multi_turn.environment_args against the environment's constructor",
        ) from None


def _check_unique(box: Toolbox) -> None:
    names = box.tool_names
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"two tools are named {repeated[0]!r} (the model calls tools by name)",
                        where="tools", valid="distinct function names over [[tools]] and the environment's methods",
                        hint="remove one of them, or rename the function")
