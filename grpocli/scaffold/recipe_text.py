"""A commented recipe: every key of the schema, with its description, type and default, the values
of a built-in recipe set and the rest commented out at their defaults (`grpo new recipe`).

Read from the schema (grpocli.recipe.fields.describe), so it cannot drift from what `grpo train`
accepts: the text it writes loads, and its set keys equal the source recipe's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from grpocli.recipe.fields import describe, submodel
from grpocli.recipe.schema import Recipe

#: Sections written as arrays of tables ([[rewards]], [[tools]]), not [section].
TABLE_ARRAYS = ("rewards", "tools")


def commented_recipe(source: Path) -> str:
    """The TOML text of `source` with every schema key explained; keys it does not set commented out."""
    values = tomllib.loads(source.read_text(encoding="utf-8"))
    head = [line for line in source.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    out = [*head, f"# Written by `grpo new recipe --from {source.stem}`: each key with its description,",
           "# type and default. Uncomment a key to set it; `grpo inspect fields` lists them too.", ""]
    rows = {row["key"]: row for row in describe()}
    for section, field in Recipe.model_fields.items():
        if submodel(field.annotation) is None:
            continue
        out.append(_comment(field.description or "", width=96))
        if section in TABLE_ARRAYS:
            out.extend(_table_array(section, values.get(section), rows))
        else:
            out.append(f"[{section}]")
            out.extend(_keys(section, values.get(section, {}), rows))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _keys(prefix: str, given: dict[str, Any], rows: dict[str, dict[str, str]]) -> list[str]:
    """One commented line per leaf key under `prefix` (nested sections as dotted keys)."""
    lines: list[str] = []
    for key, row in rows.items():
        if not key.startswith(prefix + ".") or "[]" in key:
            continue
        local = key[len(prefix) + 1:]
        value = _lookup(given, local.split("."))
        lines.append(_comment(f"{row['description']} [{row['type']}; default {row['default']}]"))
        if value is not _MISSING:
            lines.append(_assignment(local, value))
        else:
            lines.append("# " + _default_assignment(local, row["default"]))
    return lines


def _table_array(section: str, given: list[dict[str, Any]] | None, rows: dict[str, dict[str, str]]) -> list[str]:
    """[[rewards]] / [[tools]]: the source's entries, then each key the entries may take."""
    keys = {k[len(section) + 3:]: r for k, r in rows.items() if k.startswith(section + "[].")}
    lines = [f"# Each [[{section}]] entry takes:"]
    for key, row in keys.items():
        lines.append(_comment(f"  {key}: {row['description']} [{row['type']}; default {row['default']}]"))
    for entry in given or ([] if section == "tools" else Recipe.model_fields[section].default_factory()):
        if not isinstance(entry, dict):
            entry = entry.model_dump(mode="json", exclude_defaults=True)
        lines.append(f"[[{section}]]")
        lines.extend(_assignment(k, v) for k, v in entry.items())
    return lines


_MISSING = object()


def _lookup(values: dict[str, Any], parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(values, dict) or part not in values:
            return _MISSING
        values = values[part]
    return values


def _assignment(dotted: str, value: Any) -> str:
    """`key = value` in TOML on one line (a dotted key for a nested section: lora.r = 8)."""
    return f"{dotted} = {_inline(value)}"


def _inline(value: Any) -> str:
    """A TOML value on one line: arrays and tables inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return tomli_w.dumps({"_": value}).strip()[4:]


def _default_assignment(dotted: str, default: str) -> str:
    """A commented-out `key = default`; defaults with no TOML spelling (None) say so."""
    if default == "None":
        return f"{dotted} =   # unset by default"
    if default in ("(section)", "(required)"):
        return f"{dotted} = ...  # {default}"
    try:
        import ast

        return _assignment(dotted, ast.literal_eval(default))
    except (ValueError, SyntaxError, TypeError):
        return f"{dotted} = {default}"


def _comment(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width=width, initial_indent="# ", subsequent_indent="#   ")) or "#"
