"""Reward factories: a [[rewards]] function that makes the reward from its args, as TRL's
``get_soft_overlong_punishment(max_completion_len, soft_punish_cache)``,
``get_cosine_scaled_reward(...)`` and ``get_repetition_penalty_reward(...)`` do.

A function (or class) named as ``module:function`` or ``file.py:function`` whose parameters
include none of the keywords grpo passes a reward (``prompts``, ``completions``,
``completion_ids``, ...: ``grpocli.rewards.arguments.RESERVED``) and no ``**kwargs`` cannot be
a reward: it is a factory. It is called once, at load (``grpo train --dry-run`` too), with the
entry's ``args``, and what it returns is the reward, checked like any other. Its label takes the
made callable's name, as TRL names a reward (``get_callable_name``: ``__name__``, else its class's
name): ``trl.rewards:get_soft_overlong_punishment`` logs as
``trl.rewards:soft_overlong_punishment_reward``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from grpocli.errors import UserError
from grpocli.rewards.arguments import RESERVED
from grpocli.rewards.invocation import raised_at


def is_factory(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes none of the keywords a reward gets, nor ``**kwargs``: it makes one."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return False
    return not any(p.name in RESERVED for p in params)


def build(fn: Callable[..., Any], label: str, args: Mapping[str, Any], index: int) -> tuple[Callable[..., Any], str]:
    """The reward the factory ``fn`` makes from ``args`` (entry ``index`` of [[rewards]]) and its label."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    where = f"rewards[{index}].args"
    missing = _missing(fn, args)
    if missing:
        raise UserError(
            f"{label} makes a reward (a factory: it takes none of the keywords a reward gets) and needs "
            f"{', '.join(missing)}, not given",
            where=where,
            valid=f"args with every required parameter of {name}{inspect.signature(fn)}",
            hint=f"add them: args = {{ {', '.join(f'{m} = ...' for m in missing)} }}",
        )
    try:
        made = fn(**args)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - SystemExit too: it would end grpo without a word
        at = raised_at(exc)
        raise UserError(
            f"building the reward: {name}(**args) raised {type(exc).__name__}: {exc}{f' at {at}' if at else ''}",
            where=where,
            valid=f"args {name}{inspect.signature(fn)} accepts",
            hint="fix the args (or the factory)",
        ) from None
    if not callable(made):
        raise UserError(
            f"{label} takes none of the keywords a reward gets (prompts, completions, ...) so it is called as a "
            f"factory with args, and it returned {type(made).__name__}, not a reward function",
            where=f"rewards[{index}].name",
            valid="a reward fn(prompts, completions, **kwargs) -> list[float | None], or a factory that returns one",
            hint="add the reward's parameters (completions, **kwargs) to the function, or return the reward from it",
        )
    return made, _label(label, made)


def _missing(fn: Callable[..., Any], args: Mapping[str, Any]) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in args]


def _label(label: str, made: Callable[..., Any]) -> str:
    """``label`` with its function part replaced by TRL's name for the made callable."""
    inner = made
    while isinstance(inner, functools.partial):
        inner = inner.func
    called = getattr(inner, "__name__", type(inner).__name__)
    prefix, sep, _ = label.rpartition(":")
    return f"{prefix}{sep}{called}" if sep else str(called)
