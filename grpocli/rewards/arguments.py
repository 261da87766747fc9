"""The ``[[rewards]] args`` a reward accepts, and the checks that refuse any other.

A reward accepts as args its named keyword parameters (other than the keywords grpo passes
itself: ``grpocli.registry.hookspecs.REWARD_KEYWORDS``, TRL's) plus the names its
``@grpocli.recipe_args`` marker declares: the marker is how a reward that reads an arg through
``**kwargs`` says so. Any other key in a ``[[rewards]] args`` table is refused before a model
loads, so a misspelt arg is an error instead of a silently used default. The checks themselves
are the registry's, one for every kind of callable (``grpocli.registry.contracts``). A reward
that carries ``fn.check_args(args, columns, where=...)`` (the built-ins ``judge``: its rubric's
placeholders against the columns; ``code.tests``: that its sandbox can be set up here) has its arg
values checked too, in the same pass (``grpo train --dry-run``).

Light imports only. The marker itself, ``grpocli.recipe_args``, is the registry's
(``grpocli.registry.contracts.recipe_args``): curricula use it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpocli.registry import contracts
from grpocli.registry.contracts import REWARD, Resolved
from grpocli.registry.hookspecs import REWARD_KEYWORDS

#: Keywords grpo passes to every reward itself (TRL's); never ``[[rewards]] args``.
RESERVED = REWARD_KEYWORDS
MARKER = contracts.MARKER


def accepted_args(fn: Callable[..., Any]) -> set[str]:
    """The arg names ``fn`` accepts: named keyword parameters plus its ``recipe_args``."""
    return contracts.accepted_args(fn, REWARD) or set()


def check_reward_args(index: int, name: str, fn: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """UserError for the first key of ``args`` (entry ``index`` of [[rewards]]) that ``fn`` does not accept."""
    contracts.check_args(Resolved("reward", name, fn), REWARD, args, where=f"rewards[{index}].args")


def check_reward_signature(index: int, reward: Resolved, args: Mapping[str, Any], columns: Sequence[str]) -> None:
    """UserError when the reward requires a parameter grpo never passes: not one of TRL's keywords
    (RESERVED), a dataset column or a ``[[rewards]] args`` key; or one it can only take by position."""
    contracts.check(reward, REWARD, where=f"rewards[{index}].name", args=args, args_where=f"rewards[{index}].args",
                    columns=columns)
    check_values = getattr(reward.fn, "check_args", None)  # a built-in's own checks of its arg values
    if callable(check_values):
        check_values(args, columns, where=f"rewards[{index}].args")


def check_columns_read(index: int, name: str, fn: Callable[..., Any], args: Mapping[str, Any],
                       columns: Sequence[str]) -> None:
    """UserError when ``fn`` declares columns it reads through ``**kwargs`` (``fn.reads_columns(args)``: tuples,
    one column of each needed, as the built-ins arithmetic.exact, countdown.equation and math.accuracy do) and
    ``columns`` have none of a tuple's. Run per [[data.sources]] source (grpocli.trainer.source_checks)."""
    from grpocli.errors import UserError

    reads = getattr(fn, "reads_columns", None)
    if not callable(reads):
        return
    for choices in reads(dict(args)):
        if not any(column in columns for column in choices):
            raise UserError(f"reward {name!r} reads column {' or '.join(map(repr, choices))}, which the rows do not have",
                            where=f"rewards[{index}] ({name})", valid=f"dataset columns: {', '.join(columns) or '(none)'}",
                            hint="use a dataset with that column, or a reward that needs none")
