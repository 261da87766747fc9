"""The args of each served reward, fixed by the operator when `grpo reward-serve` starts.

A request never chooses how its reward runs: for ``code.tests`` the args pick the interpreter, the
isolation and the limits; for ``judge`` the endpoint and which of the server's environment
variables goes there as the key. So the args come from the command line:

    --args  'REWARD=JSON'    the args REWARD is always called with (a JSON object; ``REWARD=@FILE``
                             reads it from a .json or .toml file)
    --allow 'REWARD=JSON'    {arg: [values]}: a request may pick one of these values for that arg
                             (``@FILE`` too); unpicked, the arg is its --args value or the default

and a request's ``args`` (the [[rewards]] entry's, which grpo train sends) may only repeat them:
each key equal to the server's value, or one of the values --allow lists for it (``FixedArgs.for_request``:
a 403 naming the key otherwise). Args a reward declares ``operator_args`` (the interpreter and the
isolation of ``code.tests``, the endpoint and the key's variable of ``judge``) are set by --args alone:
--allow refuses them at start, and so does a request whose dataset columns are named like them.

At start the args are checked as ``grpo train --dry-run`` checks a recipe's: each name against
what the reward accepts, and the values through the reward's own ``check_args`` (code.tests' sandbox
runs a trivial case; judge's key variable must be set here). The dataset's columns are not known
before a request, so a ``{name}`` in a string arg (a judge rubric's placeholder) counts as a column
then; the reward checks again with the real columns on each call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpocli.errors import UserError
from grpocli.registry import contracts
from grpocli.registry.contracts import REWARD, Resolved
from grpocli.serving.access import ServerError

PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


@dataclass(frozen=True)
class FixedArgs:
    """One served reward's args (``args``) and the values a request may pick (``allowed``)."""

    reward: str
    args: dict[str, Any] = field(default_factory=dict)
    allowed: dict[str, list[Any]] = field(default_factory=dict)

    def for_request(self, sent: dict[str, Any]) -> dict[str, Any]:
        """The args to call the reward with for a request that sent ``sent``; ServerError 403 naming
        the first key that neither repeats the server's value nor picks an allowed one."""
        out = dict(self.args)
        for key, value in sent.items():
            if key in self.allowed:
                if not any(same(value, ok) for ok in self.allowed[key]):
                    raise ServerError(403, f"args.{key} = {shown(value)} is not one this server allows for "
                                           f"{self.reward}: {', '.join(shown(v) for v in self.allowed[key])} "
                                           "(grpo reward-serve --allow)")
                out[key] = value
            elif key in self.args:
                if not same(value, self.args[key]):
                    raise ServerError(403, f"args.{key} = {shown(value)} differs from {shown(self.args[key])}, the "
                                           f"value this server fixed for {self.reward} (grpo reward-serve --args): "
                                           "a request may only repeat the server's args")
            else:
                fixed = ", ".join(sorted(self.args)) or "none"
                raise ServerError(403, f"args.{key} is not the request's to set: this server fixed the args of "
                                       f"{self.reward} when it started (set: {fixed}); a request may only repeat "
                                       f"them. Leave {key} out of [[rewards]] args, or start the server with "
                                       f"--args '{self.reward}={{\"{key}\": ...}}'")
        return out

    def described(self) -> dict[str, Any]:
        """What /info says of them."""
        return {"args": self.args, "allow": self.allowed}


def same(a: Any, b: Any) -> bool:
    """JSON equality: 2 equals 2.0, true does not equal 1, lists and objects compared item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def shown(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def operator_args(fn: Any) -> tuple[str, ...]:
    """The args a reward lets only the operator set (its ``operator_args`` attribute)."""
    return tuple(getattr(fn, "operator_args", ()) or ())


def parse_options(values: list[str], option: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """``--args`` / ``--allow`` values (``REWARD=JSON`` or ``REWARD=@FILE``) by served reward; UserError
    (exit 2) for a reward not served, one given twice, or a value that is no JSON object."""
    out: dict[str, dict[str, Any]] = {}
    example = f"{option} 'code.tests={{\"isolation\": \"bwrap\"}}'"
    for value in values:
        name = next((n for n in sorted(names, key=len, reverse=True) if value.startswith(n + "=")), None)
        if name is None:
            raise UserError(f"{option} {value!r} names no reward this server serves", where=option,
                            valid=f"REWARD=JSON or REWARD=@FILE, REWARD one of: {', '.join(names)}", hint=example)
        if name in out:
            raise UserError(f"{option} is given twice for {name}", where=f"{option} {name}",
                            valid="one JSON object per reward, holding all its keys")
        out[name] = _object(value[len(name) + 1:], f"{option} {name}")
    return out


def _object(text: str, where: str) -> dict[str, Any]:
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            raw = path.read_text()
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}", where=where, valid="a readable .json or .toml file")
        if path.suffix == ".toml":
            import tomllib

            try:
                return tomllib.loads(raw)
            except tomllib.TOMLDecodeError as exc:
                raise UserError(f"{path} is not TOML: {exc}", where=where, valid="a TOML table of args") from None
        text = raw
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{text[:80]!r} is not JSON: {exc}", where=where,
                        valid='a JSON object, e.g. {"isolation": "bwrap", "memory_mb": 1024} (quoted for the shell)',
                        hint="or @FILE: a .json or .toml file holding the args") from None
    if not isinstance(data, dict):
        raise UserError(f"{type(data).__name__} given; args are a JSON object", where=where,
                        valid='a JSON object, e.g. {"isolation": "bwrap"}')
    return data


def fixed_args(name: str, fn: Any, args: dict[str, Any], allowed: dict[str, Any]) -> FixedArgs:
    """The checked FixedArgs of one served reward (module docstring); UserError (exit 2) otherwise."""
    resolved = Resolved("reward", name, fn)
    contracts.check_args(resolved, REWARD, args, where=f"--args {name}")
    contracts.check_args(resolved, REWARD, allowed, where=f"--allow {name}")
    only = operator_args(fn)
    for key, values in allowed.items():
        if key in only:
            raise UserError(f"{name}'s {key} is the operator's alone: no request may choose it, not even from a list",
                            where=f"--allow {name}.{key}", valid=f"--allow for args other than {', '.join(only)}",
                            hint=f"set it once: --args '{name}={{\"{key}\": ...}}'")
        if not isinstance(values, list) or not values:
            raise UserError(f"--allow {name}: {key} = {shown(values)} is not a list of values",
                            where=f"--allow {name}.{key}",
                            valid=f'{{"{key}": [value, value, ...]}}: the values a request may pick')
    check = getattr(fn, "check_args", None)  # the reward's own checks of its values (as at --dry-run)
    if callable(check):
        for picked in [{}] + [{key: v} for key, values in allowed.items() for v in values]:
            tried = {**args, **picked}
            where = f"--allow {name}.{next(iter(picked))}" if picked else f"--args {name}"
            check(tried, _placeholders(tried), where=where)
    return FixedArgs(name, dict(args), {k: list(v) for k, v in allowed.items()})


def _placeholders(args: dict[str, Any]) -> list[str]:
    """Every ``{name}`` in the string values of ``args``: the columns the server assumes at start."""
    return sorted({m for v in args.values() if isinstance(v, str) for m in PLACEHOLDER.findall(v)})


__all__ = ["FixedArgs", "fixed_args", "operator_args", "parse_options", "same"]
