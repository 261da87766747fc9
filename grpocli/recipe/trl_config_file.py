"""Reading a TRL GRPOConfig for `grpo import trl`: a YAML or JSON of its fields (what
`trl grpo --config` takes), or a Python file that builds a GRPOConfig.

A Python file is executed in this process (no subprocess), in a fresh namespace whose
``__name__`` is not ``"__main__"``, so a ``if __name__ == "__main__":`` block that starts training
does not run. It is code: import only files you would run. The one GRPOConfig instance it leaves
at module level is the config; its fields that differ from GRPOConfig's defaults are read.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

HINT = "grpo import trl CONFIG.yaml -o recipe.toml"
VALID = "a YAML or JSON file of GRPOConfig fields (as `trl grpo --config` takes), or a .py file that builds a GRPOConfig"
#: Fields GRPOConfig.__post_init__ derives from others; a built config's values are not the user's.
DERIVED = ("generation_batch_size",)


def read_config(path: str | Path) -> dict[str, Any]:
    """The TRL fields the file sets, by name."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such file: {path}", valid=VALID, hint=HINT)
    if path.suffix == ".py":
        return _from_python(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError, json.JSONDecodeError: both say line and column
        raise UserError(f"{path} does not parse: {exc}", valid=VALID, hint=HINT) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a {type(data).__name__}, not a mapping of field names to values",
                        valid=VALID, hint=HINT)
    return data


def _from_python(path: Path) -> dict[str, Any]:
    try:
        from trl import GRPOConfig
    except ImportError:
        raise UserError(f"reading {path} needs TRL (it builds a GRPOConfig)", valid=VALID,
                        hint="pip install trl, or write the fields as YAML") from None
    namespace: dict[str, Any] = {"__name__": "__grpo_import__", "__file__": str(path)}
    try:
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)  # noqa: S102 - the user's file
    except SystemExit as exc:
        raise UserError(f"{path} called sys.exit({exc.code}) while it was read", valid=VALID, hint=HINT) from None
    except Exception as exc:
        raise UserError(f"{path} raised {type(exc).__name__}: {exc}", valid=VALID, hint=HINT) from None
    configs = [(name, v) for name, v in namespace.items() if isinstance(v, GRPOConfig)]
    if len(configs) != 1:
        found = ", ".join(name for name, _ in configs) or "none"
        raise UserError(f"{path} must leave exactly one GRPOConfig at module level; found {found}",
                        valid=VALID, hint="assign it to a name, e.g. `args = GRPOConfig(...)`")
    config = configs[0][1]
    # `config` ran __post_init__ (in one process): compare with a default config built the same way.
    default = GRPOConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                            if f.name in ("output_dir",)})
    fields = {}
    for f in dataclasses.fields(config):
        if f.name in DERIVED or not f.init:
            continue
        value, base = getattr(config, f.name), getattr(default, f.name)
        if value != base:
            fields[f.name] = value
    if fields.get("steps_per_generation") == config.gradient_accumulation_steps:
        fields.pop("steps_per_generation")  # what __post_init__ derives when it is unset
    return fields
