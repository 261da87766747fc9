"""A file given as a recipe that is another trainer's config: said so, with the command that imports it.

`grpo train config.yaml` on a TRL config (a YAML or JSON of GRPOConfig fields, as `trl grpo --config`
takes, or a Python file that builds a GRPOConfig) would otherwise stop at "not valid TOML". This is
asked only of a file that TOML cannot read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpocli.errors import UserError

KINDS = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".py": "Python"}
MAX_SNIFF_CHARS = 1 << 20  # a GRPOConfig's fields take a few KB; a larger file is not read as YAML
SHOWN = 4  # TRL fields named in the message


def foreign_config(path: Path, text: str) -> UserError | None:
    """The UserError for a recipe file that is a TRL config or another format's file, else None."""
    kind = KINDS.get(path.suffix.lower())
    fields = [] if kind == "Python" else trl_fields_in(text)
    if kind is None and not fields:
        return None
    importing = f"grpo import trl {path} -o recipe.toml, then grpo train recipe.toml"
    if fields:
        more = ", ..." if len(fields) > SHOWN else ""
        what = (f"this is a TRL config ({kind or 'YAML'} of GRPOConfig fields: {', '.join(fields[:SHOWN])}{more}), "
                "not a grpo recipe (TOML)")
        hint = importing
    elif kind == "Python":
        what = "this is a Python file, not a grpo recipe (TOML)"
        hint = f"if it builds a TRL GRPOConfig: {importing}"
    else:
        what = f"this is {kind}, not a grpo recipe (TOML)"
        hint = f"if it holds TRL GRPOConfig fields: {importing}; else start from `grpo inspect recipe quickstart`"
    return UserError(what, where=str(path), valid="a TOML recipe ([section] tables of key = value) or a built-in "
                     "recipe's name (`grpo inspect recipes`)", hint=hint)


def trl_fields_in(text: str) -> list[str]:
    """The TRL GRPOConfig fields and `trl grpo` arguments ``text`` sets as a YAML (or JSON) mapping, in
    its order; [] for text that is not one."""
    from grpocli.recipe.trl_import import REWARD_FIELDS, SCRIPT_FIELDS
    from grpocli.recipe.trl_names import TRL_FIELDS

    if len(text) > MAX_SNIFF_CHARS:
        return []
    data = _yaml(text)
    if not isinstance(data, dict):
        return []
    known = {*TRL_FIELDS, *SCRIPT_FIELDS, *REWARD_FIELDS}
    return [str(k) for k in data if k in known]


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)  # JSON is YAML too
    except Exception:  # noqa: BLE001 - yaml.YAMLError, RecursionError: then it is no config either
        return None
