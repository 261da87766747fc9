"""The ``[[rewards]] args`` a reward accepts, and the check that refuses any other.

A reward accepts as args its named keyword parameters (other than TRL's keywords, which grpo
passes itself: ``grpocli.rewards.context.TRL_KEYWORDS``) plus the names its ``@grpocli.recipe_args``
marker declares: the marker is how a reward that reads an arg through ``**kwargs`` says so.
Any other key in a ``[[rewards]] args`` table is refused before a model loads, so a misspelt
arg is an error instead of a silently used default.

Light imports only: plugins reach this module through ``grpocli.recipe_args``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TypeVar

from grpocli.errors import UserError, did_you_mean
from grpocli.rewards.context import TRL_KEYWORDS

F = TypeVar("F", bound=Callable[..., Any])

#: Keywords grpo passes to every reward itself (TRL's); never ``[[rewards]] args``.
RESERVED = TRL_KEYWORDS
MARKER = "recipe_args"


def recipe_args(*names: str) -> Callable[[F], F]:
    """Declare ``[[rewards]] args`` that a reward reads through ``**kwargs``.

    ``@grpocli.recipe_args("scale", "mode")`` on ``def fn(prompts, completions, **kwargs)``
    lets a recipe set ``args = {scale = 2, mode = "strict"}``. Named keyword parameters are
    accepted without it; the names add to them.
    """
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier() or n in RESERVED]
    if bad:
        raise TypeError(f"recipe_args takes argument names (identifiers other than {', '.join(RESERVED)}), "
                        f"got {bad!r}")

    def mark(fn: F) -> F:
        setattr(fn, MARKER, frozenset(names))
        return fn

    return mark


def accepted_args(fn: Callable[..., Any]) -> set[str]:
    """The arg names ``fn`` accepts: named keyword parameters plus its ``recipe_args``."""
    return (_named_parameters(fn) | _declared(fn)) - set(RESERVED)


def check_reward_args(index: int, name: str, fn: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """UserError for the first key of ``args`` (entry ``index`` of [[rewards]]) that ``fn`` does not accept."""
    refuse_unknown_args(args, accepted_args(fn), what=f"reward {name!r}", where=f"rewards[{index}].args",
                        hint="fix the arg's name, or leave it out; a reward that reads args through **kwargs "
                        'declares them with @grpocli.recipe_args("name", ...)')


def refuse_unknown_args(args: Mapping[str, Any], accepted: set[str], *, what: str, where: str, hint: str) -> None:
    """UserError at ``where.KEY`` for the first key of ``args`` not in ``accepted`` (rewards, curricula)."""
    for key in args:
        if key not in accepted:
            raise UserError(
                f"{what} takes no argument {key!r}{did_you_mean(key, accepted)}",
                where=f"{where}.{key}",
                valid=", ".join(sorted(accepted)) or f"(this {what.split()[0]} takes no args)",
                hint=hint,
            )


def _named_parameters(fn: Callable[..., Any]) -> set[str]:
    """Names ``fn`` takes as keywords (not ``**kwargs``); empty when it has no signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have none
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _declared(fn: Callable[..., Any]) -> frozenset[str]:
    """The names of ``fn``'s marker (also through functools.partial), or none."""
    marker = getattr(fn, MARKER, None)
    if marker is None and isinstance(fn, functools.partial):
        marker = getattr(fn.func, MARKER, None)
    return frozenset(marker or ())


def check_reward_signature(index: int, name: str, fn: Callable[..., Any], args: Mapping[str, Any],
                           columns: Sequence[str]) -> None:
    """UserError when ``fn`` requires a parameter grpo never passes: not one of TRL's keywords
    (RESERVED), a dataset column or a ``[[rewards]] args`` key; or one it can only take by position."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to check
        return
    given = set(RESERVED) | set(columns) | set(args)
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if not required or (p.name in given and p.kind is not p.POSITIONAL_ONLY):
            continue
        how = "positional-only, and grpo passes every argument by keyword" if p.kind is p.POSITIONAL_ONLY \
            else "neither one of the keywords every reward gets nor a dataset column or [[rewards]] arg"
        raise UserError(
            f"reward {name!r} requires parameter {p.name!r}, which is {how}",
            where=f"rewards[{index}] ({name})",
            valid=f"keywords {', '.join(RESERVED)}; dataset columns {', '.join(sorted(columns)) or '(none)'}; "
            "[[rewards]] args",
            hint=f"give {p.name!r} a default, take it from **kwargs, add a dataset column or an arg of "
            "that name, or fix the function's signature",
        )
