"""Bool flags that also take a value, as TRL's command lines (transformers' HfArgumentParser) read them.

`trl vllm-serve --enforce_eager True` gives a bool field its value in the next word (or after `=`);
click's flags take none, so `True` would be left over (and `False` would turn the flag on). A command
made with ``cls=BoolValueCommand`` reads `--flag VALUE` and `--flag=VALUE` for each of its bool flags,
in every spelling the flag has, and turns them into the bare flag or its `--no-` form before click
parses them; the bare flag still means true. Words after `--` are left alone (they are another
program's).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

#: What HfArgumentParser's string_to_bool takes (any case).
TRUE = ("yes", "true", "t", "y", "1")
FALSE = ("no", "false", "f", "n", "0")


class BoolValueCommand(TyperCommand):
    """A typer command whose bool flags also take true/false as a value (see the module docstring)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_bool_values(self.params, list(args), ctx.command_path))


def with_bool_values(params: list[Any], args: list[str], command: str = "grpo") -> list[str]:
    """``args`` with every `--flag VALUE` / `--flag=VALUE` of a bool flag written as `--flag` or its
    `--no-` form (a flag without one and false: left out, its default); UserError for another value."""
    flags = _bool_flags(params)
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if name not in flags or (not eq and (i + 1 == len(args) or args[i + 1].startswith("-"))):
            out.append(arg)  # not a bool flag, or one alone: click reads it
            i += 1
            continue
        if not eq:
            value, i = args[i + 1], i + 1
        out.extend(_as_flag(flags[name], name, value, command))
        i += 1
    return out


def _bool_flags(params: list[Any]) -> dict[str, tuple[Any, bool]]:
    """{spelling: (option, what the bare spelling means)} for each bool flag but --help (the params are
    click's Options, of the click typer vendors)."""
    out: dict[str, tuple[Any, bool]] = {}
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "is_bool_flag", False) and p.name != "help":
            out.update({name: (p, True) for name in p.opts})
            out.update({name: (p, False) for name in p.secondary_opts})
    return out


def _as_flag(flag: tuple[Any, bool], name: str, value: str, command: str) -> list[str]:
    from grpocli.errors import UserError

    option, bare = flag
    word = value.strip().lower()
    if word not in TRUE + FALSE:
        raise UserError(f"{name} takes true or false, not {value!r}", where=command,
                        valid=f"{name} alone (true), or {name} followed by one of "
                              f"{'/'.join(TRUE)} or {'/'.join(FALSE)} (any case)",
                        hint=f"{command} ... {option.opts[0]}" + (f" (or {option.secondary_opts[0]})"
                                                                  if option.secondary_opts else ""))
    wanted = (word in TRUE) == bare
    if wanted:
        return [option.opts[0]]
    if option.secondary_opts:
        return [option.secondary_opts[0]]
    if not option.default:
        return []  # false is the default of a flag without a --no- form
    raise UserError(f"{name} cannot be turned off here", where=command, valid=f"{name} alone",
                    hint=f"leave {name} out")
