"""A plugin's callable checked against the Protocol of its kind (grpocli.registry.hookspecs).

grpo calls rewards, dataset loaders, curricula, tools and environments with keyword
arguments it knows in advance (the Protocol's keywords, the dataset's columns, the recipe's
args), so a signature that cannot take them is found from the signature alone, before any
model loads. ``check`` refuses, as a UserError that names the plugin (or the ``module:function``
reference), the function and the parameter:

- a recipe arg (``[[rewards]] args``, ``data.args``, ``train.curriculum_args``,
  ``multi_turn.environment_args``) the callable does not accept, or one that would set a
  keyword grpo passes itself;
- a parameter without a default that grpo would have to pass by position;
- a keyword grpo passes on every call that the callable takes neither by name nor through
  ``**kwargs`` (every kind but rewards, which get only the keywords they name, as in TRL);
- a parameter without a default that nothing passes.

``check_tool`` refuses what a tool's JSON schema cannot describe or a keyword call cannot fill.
Callables without a signature (some builtins and C functions) are not checked.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from grpocli.errors import UserError, did_you_mean
from grpocli.registry import hookspecs

#: The attribute ``@grpocli.recipe_args("name", ...)`` sets: args read through ``**kwargs``.
MARKER = "recipe_args"
F = TypeVar("F", bound=Callable[..., Any])


def recipe_args(*names: str) -> Callable[[F], F]:
    """Declare ``[[rewards]] args`` (or ``train.curriculum_args``) that a function reads through ``**kwargs``.

    ``@grpocli.recipe_args("scale", "mode")`` on ``def fn(prompts, completions, **kwargs)``
    lets a recipe set ``args = {scale = 2, mode = "strict"}``. Named keyword parameters are
    accepted without it; the names add to them.
    """
    reserved = hookspecs.REWARD_KEYWORDS
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier() or n in reserved]
    if bad:
        raise TypeError(f"recipe_args takes argument names (identifiers other than {', '.join(reserved)}), "
                        f"got {bad!r}")

    def mark(fn: F) -> F:
        setattr(fn, MARKER, frozenset(names))
        return fn

    return mark


@dataclass(frozen=True)
class Contract:
    """How grpo calls one kind of callable: the Protocol that documents it, the keywords it
    passes on every call, and where the recipe's args for it may go."""

    kind: str                             # as messages name it: "reward", "curriculum", ...
    protocol: type                        # the Protocol in grpocli.registry.hookspecs
    call: str                             # how grpo calls it, for messages
    keywords: tuple[str, ...] = ()        # passed on every call, by keyword
    takes_every_keyword: bool = True      # False: grpo passes only the keywords it names (rewards)
    kwargs_take_args: bool = False        # True: **kwargs takes any arg; False: args are named or
                                          # declared with @grpocli.recipe_args
    keywords_from: str = ""               # the recipe keys the keywords come from, for a hint
    arg_key_in_where: bool = True         # errors about an arg are at ARGS.KEY (data.args's: at ARGS)


REWARD = Contract(
    "reward", hookspecs.RewardFunction,
    f"fn({', '.join(f'{k}=...' for k in hookspecs.REWARD_KEYWORDS)}, <each dataset column>=..., **args), "
    "passing only the keywords fn names unless it takes **kwargs",
    hookspecs.REWARD_KEYWORDS, takes_every_keyword=False)
DATASET = Contract(
    "dataset", hookspecs.DatasetLoader, "loader(split=..., seed=..., **data.args)", hookspecs.DATASET_KEYWORDS,
    kwargs_take_args=True, keywords_from="data.split / data.eval_split and train.seed", arg_key_in_where=False)
CURRICULUM = Contract(
    "curriculum", hookspecs.Curriculum,
    f"fn({', '.join(f'{k}=...' for k in hookspecs.CURRICULUM_KEYWORDS)}, **train.curriculum_args)",
    hookspecs.CURRICULUM_KEYWORDS)
TOOL = Contract("tool", hookspecs.Tool, "fn(**arguments), the model's call by keyword")
ENVIRONMENT = Contract("environment", hookspecs.EnvironmentFactory, "factory(**multi_turn.environment_args)",
                       kwargs_take_args=True)
ENVIRONMENT_RESET = Contract("environment", hookspecs.Environment, "env.reset(**row), every column of the row")
ENVIRONMENT_REWARD = Contract("environment", hookspecs.Environment, "env.get_reward(), without arguments")


@dataclass(frozen=True)
class Resolved:
    """A callable a recipe names, and who provides it: a plugin (``plugin``, ``distribution``)
    or, without them, a ``module:function`` reference. ``str()`` says both, for messages."""

    kind: str
    name: str                       # as the recipe writes it
    fn: Callable[..., Any]
    plugin: str | None = None
    distribution: str | None = None
    method: str | None = None       # one method of an environment, checked on its own

    @classmethod
    def of(cls, kind: str, entry: Any) -> Resolved:
        """From a registry entry (``grpocli.registry.names.Entry``)."""
        return cls(kind, entry.name, entry.fn, entry.plugin, entry.distribution)

    def at(self, method: str, fn: Callable[..., Any]) -> Resolved:
        """The same thing's method ``method`` (``fn``, bound)."""
        return replace(self, fn=fn, method=method)

    def __str__(self) -> str:
        subject = f"{self.kind} {self.name!r}"
        if self.plugin is not None:
            return f"{subject} ({function_name(self.fn)}, plugin {self.plugin} from {self.distribution})"
        return f"{subject} (method {self.method})" if self.method else subject


def function_name(fn: Any) -> str:
    """``module:qualified.name`` of a function, method, class, partial or callable object."""
    target = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", fn)
    if not hasattr(target, "__qualname__"):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}:{target.__qualname__}"


def accepted_args(fn: Callable[..., Any], contract: Contract) -> set[str] | None:
    """The recipe args ``fn`` accepts: its named parameters and its ``recipe_args``, less the
    contract's keywords; None for any (``**kwargs`` where the contract lets it take args)."""
    params = parameters(fn)
    if contract.kwargs_take_args and params is not None and any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = {p.name for p in params or () if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return (named | declared_args(fn)) - set(contract.keywords)


def declared_args(fn: Callable[..., Any]) -> frozenset[str]:
    """The names of ``fn``'s ``@grpocli.recipe_args`` marker (also through functools.partial)."""
    marker = getattr(fn, MARKER, None)
    if marker is None and isinstance(fn, functools.partial):
        marker = getattr(fn.func, MARKER, None)
    return frozenset(marker or ())


def parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """``fn``'s parameters (a class's: its constructor's, a bound method's: without self);
    None when it has no signature."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins and C callables have none
        return None


def check_args(resolved: Resolved, contract: Contract, args: Mapping[str, Any], *, where: str) -> None:
    """UserError for the first key of ``args`` (the recipe table at ``where``) that the callable
    does not accept, or that would set a keyword grpo passes itself."""
    accepted = accepted_args(resolved.fn, contract)
    listed = ", ".join(sorted(accepted)) if accepted else f"(this {contract.kind} takes no args)"
    for key in args:
        at = f"{where}.{key}" if contract.arg_key_in_where else where
        if key in contract.keywords:
            raise UserError(
                f"{where} may not set {key}: grpo passes {key!r} to every {contract.kind} itself",
                where=at, valid=listed if accepted is not None else f"any key but {', '.join(contract.keywords)}",
                hint=f"set {contract.keywords_from} instead" if contract.keywords_from else f"remove {key}",
            )
        if accepted is not None and key not in accepted:
            hint = (f"fix the arg's name, or leave it out; `grpo inspect plugins` describes each {contract.kind}"
                    if contract.kwargs_take_args else
                    f"fix the arg's name, or leave it out; a {contract.kind} that reads args through **kwargs "
                    'declares them with @grpocli.recipe_args("name", ...)')
            raise UserError(f"{resolved} takes no argument {key!r}{did_you_mean(key, accepted)}",
                            where=at, valid=listed, hint=hint)


def check(resolved: Resolved, contract: Contract, *, where: str, args: Mapping[str, Any] | None = None,
          args_where: str | None = None, columns: Collection[str] | None = None) -> None:
    """UserError unless grpo can call ``resolved.fn`` as ``contract`` says, with ``args`` (the
    recipe's table at ``args_where``) and, where given, each of ``columns`` (dataset columns)
    as keywords too. ``where`` is the recipe key that names the callable."""
    args = dict(args or {})
    if args_where is not None:
        check_args(resolved, contract, args, where=args_where)
    params = parameters(resolved.fn)
    if params is None:
        return
    passed = (*contract.keywords, *sorted(columns or ()))
    valid = f"grpo calls every {contract.kind} as {contract.call}"
    if columns is not None:
        valid += f"; dataset columns: {', '.join(sorted(columns)) or '(none)'}"
    if args_where is not None:
        valid += f"; {args_where}: {', '.join(sorted(args)) or '(none set)'}"
    fix = f"the contract is grpocli.registry.hookspecs.{contract.protocol.__name__}"
    for p in params:
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise UserError(f"{resolved} takes parameter {p.name!r} by position only, and grpo passes every "
                            "argument by keyword", where=where, valid=valid,
                            hint=f"make {p.name!r} a keyword parameter (no '/' before it); {fix}")
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if contract.takes_every_keyword and not any(p.kind is p.VAR_KEYWORD for p in params):
        for key in passed:
            if key not in named:
                which = f"to every {contract.kind}" if key in contract.keywords else "as a column of the dataset"
                raise UserError(f"{resolved} does not take keyword {key!r}, which grpo passes {which}",
                                where=where, valid=valid, hint=f"add a parameter {key!r}, or take **kwargs; {fix}")
    given = set(passed) | set(args)
    for p in params:
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in given:
            continue
        nothing = ("neither one of the keywords grpo passes nor a dataset column" if columns is not None
                   else "not one of the keywords grpo passes" if contract.keywords else "")
        if args_where is not None:
            raise UserError(f"{resolved} needs {args_where}.{p.name}: parameter {p.name!r} has no default"
                            + (f" and is {nothing}" if nothing else ""), where=args_where, valid=valid,
                            hint=f"set {args_where}.{p.name}, or give {p.name!r} a default"
                            + (", or add a dataset column of that name" if columns is not None else "") + f"; {fix}")
        raise UserError(f"{resolved} requires parameter {p.name!r}, which grpo does not pass"
                        + (f" ({nothing})" if nothing else ""), where=where, valid=valid,
                        hint=f"give {p.name!r} a default, or remove it; {fix}")


def check_tool(resolved: Resolved, *, where: str) -> None:
    """UserError for a tool parameter the model's keyword call cannot fill (positional-only,
    ``*args``) or the JSON schema cannot describe (no type hint)."""
    for p in parameters(resolved.fn) or ():
        problem = None
        if p.kind is p.POSITIONAL_ONLY:
            problem = f"takes parameter {p.name!r} by position only, and the model's calls arrive as keyword arguments"
        elif p.kind is p.VAR_POSITIONAL:
            problem = f"takes *{p.name}, and the model's calls arrive as keyword arguments"
        elif p.annotation is p.empty:
            problem = f"has no JSON schema: parameter {p.name!r} has no type hint"
        if problem:
            raise UserError(
                f"{resolved} {problem}", where=where,
                valid="a function with a type hint on every parameter, each taken by keyword, and a docstring with "
                "a summary line and an 'Args:' entry per parameter (Google style)",
                hint="fix the signature, e.g. def add(a: int, b: int) -> int; the contract is "
                f"grpocli.registry.hookspecs.{TOOL.protocol.__name__}",
            )
