"""Overrides written in another command line's shape, answered with grpo's spelling.

grpo's overrides are ``section.key=value`` after the recipe. TRL's scripts (HfArgumentParser) take
``--learning_rate 1e-6``, and a bare ``learning_rate=1e-6`` or ``--train.learning_rate 1e-6`` are
near misses; each gets a UserError naming the override that was meant: a recipe key by its dotted
name, a TRL GRPOConfig field through ``TRL_FIELDS`` (with its note where the unit differs or grpo
has no such setting), or a key of grpo's by its last part (``learning_rate`` -> ``train.learning_rate``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from grpocli.errors import UserError, did_you_mean
from grpocli.recipe.fields import every_key
from grpocli.recipe.schema import Recipe
from grpocli.recipe.trl_names import TRL_FIELDS, TRL_UNITS

#: Sections holding lists of tables: their keys are set whole (`rewards=[{...}]`), not one by one.
LIST_SECTIONS = ("rewards", "tools")
VALID = "section.key=value after the recipe, e.g. train.learning_rate=2e-6 (values are TOML)"


def check_override_shapes(args: Sequence[str], *, command: str = "grpo", recipe: str | None = None,
                          options: Sequence[str] = ()) -> None:
    """UserError for the first of ``args`` shaped as another tool's: `--name [value]`, `--name=value`
    or `name=value` without a section (``command`` and ``recipe`` make the next command; ``options``:
    the command's own, for a misspelt one)."""
    for i, arg in enumerate(args):
        if arg.startswith("-") and not _is_number(arg):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and "=" not in args[i + 1] and (
                    not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                value = args[i + 1]
            raise _dashed(name, value, command, recipe, options)
    sections = set(Recipe.model_fields)
    for arg in args:
        key, eq, value = arg.partition("=")
        key = key.strip()
        if eq and key and "." not in key and key not in sections:
            meant, note = suggestion(key)
            raise UserError(f"the override {arg!r} names no section{_said(key, meant, value.strip(), note)}",
                            where="command line", valid=VALID,
                            hint=_hint(key, meant, value.strip(), note, command, recipe))


def suggestion(name: str) -> tuple[str | None, str]:
    """(the recipe key ``name`` means, a note): a dotted key, a TRL field, or the last part of one key.
    A note says why the value is not copied over (TRL's unit differs) or why there is no key."""
    name = name.lstrip("-").strip().replace("-", "_")
    if name in every_key() and "." in name:
        return name, ""
    if name in TRL_FIELDS:
        key, note = TRL_FIELDS[name]
        if key is None:
            return None, f"TRL's {name} has no grpo setting: {note}"
        same = name not in TRL_UNITS and (not note or note.startswith("TRL's default")) and "[]" not in key
        return key, "" if same else f"TRL's {name} is {key} in grpo: {note}"
    leaf = name.rsplit(".", 1)[-1]
    owners = _by_leaf().get(leaf)
    if owners is None:
        close = did_you_mean(leaf, [*_by_leaf(), *TRL_FIELDS]) or did_you_mean(name, every_key())
        return suggestion(close.split('"')[1]) if close else (None, "")
    if len(owners) == 1:
        return owners[0], ""
    return None, f"{leaf} is a key of several sections: {', '.join(owners)}"


def _dashed(name: str, value: str, command: str, recipe: str | None, options: Sequence[str]) -> UserError:
    meant, note = suggestion(name)
    own = did_you_mean(name, options) if meant is None else ""
    what = f"{name} is not an option of {command}{own}"
    if not own:
        what += f"; recipe keys are set as section.key=value{_said(name, meant, value, note)}"
    listed = f"; {command}'s options: {', '.join(options)}" if options else ""
    return UserError(what, where="command line", valid=VALID + listed,
                     hint=_hint(name, meant, value, note, command, recipe) if not own else f"{command} -h")


def _said(name: str, meant: str | None, value: str, note: str) -> str:
    """' (did you mean "train.learning_rate=1e-6"?)' and the note, or the note alone."""
    if meant is None:
        return f" ({note})" if note else ""
    shown = f"{meant}={value}" if value and not note else meant
    return f' (did you mean "{shown}"?' + (f" {note})" if note else ")")


def _hint(name: str, meant: str | None, value: str, note: str, command: str, recipe: str | None) -> str:
    trl = name.lstrip("-")
    if meant is None:
        return "`grpo inspect fields SECTION` lists every key; `grpo inspect fields --trl NAME` the recipe key of " \
               "a TRL field"
    if "[]" in meant:
        return f"`grpo inspect fields --trl {trl}`; [[rewards]] entries are set whole: rewards=[{{...}}]"
    fixed = f"{meant}={value if value and not note else 'VALUE'}"
    said = f"{command} {recipe} {fixed}" if recipe else f"write it as {fixed}"
    return said + (f" (`grpo inspect fields --trl {trl}` says what the value becomes)" if note else "")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@functools.cache
def _by_leaf() -> dict[str, list[str]]:
    """{last part: [dotted keys ending with it]} over the keys an override sets one by one (values, not
    sections; not inside the lists of tables [[rewards]] and [[tools]], which are set whole)."""
    keys = [k for k in every_key() if "." in k and k.split(".")[0] not in LIST_SECTIONS]
    parents = {k.rsplit(".", 1)[0] for k in keys}
    out: dict[str, list[str]] = {}
    for key in keys:
        if key not in parents:
            out.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    return out
