"""Reading a TRL GRPOConfig for `grpo import trl`: a YAML or JSON of its fields (what
`trl grpo --config` takes), or a Python file that builds a GRPOConfig.

A Python file is a training script: it runs in a child process as `python SCRIPT.py ARGS` would, with
stand-ins for training, downloads and the network (grpocli.recipe.trl_script says what is stubbed).
It is code: import only files you would run.

What is read is bounded: a file over ``MAX_CONFIG_BYTES`` is refused before it is read, and a
config holding more than ``MAX_VALUES`` values once YAML's aliases are expanded (a 412-byte alias
bomb expands to millions) is refused before anything walks it whole; YAML's aliases are shared
objects when loaded, so loading one costs what the file's own size does. Each value is then
checked against the type TRL gives its field (grpocli.recipe.trl_types).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

HINT = "grpo import trl CONFIG.yaml -o recipe.toml"
MAX_CONFIG_BYTES = 1 << 20  # a GRPOConfig's fields take a few KB
MAX_VALUES = 10_000  # values in the config, aliases expanded (TRL's GRPOConfig has ~150 fields)
VALID = ("a YAML or JSON file of GRPOConfig fields (as `trl grpo --config` takes), or a .py file that builds a "
         "GRPOConfig")


def read_config(path: str | Path, args: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The TRL fields the file sets, by name, each value of the type TRL gives it (UserError otherwise)."""
    return read_source(path, args)[0]


def read_source(path: str | Path, args: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """The TRL fields the file sets (checked as read_config) and notes on what a script did that no field
    says; ``args``: a script's own command-line arguments."""
    from grpocli.recipe.trl_types import check_fields

    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such file: {path}", valid=VALID, hint=HINT)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise UserError(f"{path} is {size:,} bytes: larger than a GRPOConfig's fields take", valid=f"{VALID}, "
                        f"at most {MAX_CONFIG_BYTES:,} bytes", hint="is it the config file? " + HINT)
    notes: list[str] = []
    if path.suffix == ".py":
        from grpocli.recipe.trl_script import script_fields

        data, notes = script_fields(path, list(args))
    elif args:
        raise UserError(f"arguments after {path} ({' '.join(args)}) are a script's, and {path} is no script",
                        valid="arguments after -- only with a .py file", hint=HINT)
    else:
        data = _from_text(path)
    values = count_values(data, MAX_VALUES + 1)
    if values > MAX_VALUES:
        raise UserError(f"{path} holds more than {MAX_VALUES:,} values once its YAML aliases (*name) are expanded "
                        "(or a value that holds itself)", valid=f"{VALID}, of at most {MAX_VALUES:,} values",
                        hint="write the values out instead of nesting aliases, or check the file is a GRPOConfig")
    return check_fields(data, str(path), from_text=path.suffix != ".py"), notes


def _from_text(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except RecursionError:
        raise UserError(f"{path} nests its values deeper than Python can read", valid=VALID, hint=HINT) from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError, json.JSONDecodeError: both say line and column
        raise UserError(f"{path} does not parse: {exc}", valid=VALID, hint=HINT) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a {type(data).__name__}, not a mapping of field names to values",
                        valid=VALID, hint=HINT)
    return data


def count_values(data: Any, limit: int) -> int:
    """How many values ``data`` holds, each container and scalar once per place it appears (a shared
    object, as a YAML alias loads, counts at each place); stops counting at ``limit``."""
    count, stack = 0, [data]
    while stack and count < limit:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set)):
            stack.extend(value)
    return count
