"""Load a recipe: defaults < recipe file < GRPO_SECTION__KEY env vars < `section.key=value` args.

Arguments and environment variables are read the same way: the value as a TOML value
(`50`, `2e-6`, `true`, `"text"`, `[1, 2]`, `{num_samples = 10}`), else as JSON (lists and
tables as JSON, e.g. `{"num_samples": 10}`), else as the text itself; the schema then checks its
type strictly (`true` is no integer), and an error names the variable or argument it came from.

Every value remembers where it came from (`Resolved.sources`), so errors and
`grpo inspect recipe` can say "train.steps = 3 (argument train.steps=3)".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
import tomllib
from pydantic import BaseModel, ValidationError

from grpocli.errors import UserError, did_you_mean
from grpocli.recipe import catalog
from grpocli.recipe.fields import unknown_keys
from grpocli.recipe.schema import Recipe

DEFAULT = "default"
ENV_PREFIX = "GRPO_"


@dataclass
class Resolved:
    """A validated recipe, its name, its file, and the source of every dotted key."""

    recipe: Recipe
    name: str
    path: Path | None
    sources: dict[str, str]
    cwd: Path = field(default_factory=Path.cwd)  # where relative paths start: the directory it was loaded in

    def source_of(self, dotted: str) -> str:
        return _source_of(self.sources, dotted)

    def output_dir(self) -> Path:
        """The run directory, absolute: relative to the directory the recipe was loaded in, so that a
        reward or tool that changes directory (os.chdir) cannot split the run between two places."""
        path = Path(self.recipe.train.output_dir.replace("{recipe}", self.name)).expanduser()
        return Path(os.path.normpath(self.cwd / path))


def load_recipe(
    name_or_path: str | None,
    overrides: list[str] | None = None,
) -> Resolved:
    """Resolve, merge and validate a recipe; every mistake is a UserError (exit code 2)."""
    path = catalog.find(name_or_path) if name_or_path else None
    file_values = _read_toml(path) if path else {}
    env_values = _env_values()
    arg_values = parse_overrides(overrides or [])

    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    _merge(merged, sources, file_values, f"file {path}" if path else "", "")
    _merge(merged, sources, env_values, "env", "")
    _merge(merged, sources, arg_values, "argument", "")
    where_file = str(path) if path else "(no recipe file)"
    try:
        recipe = Recipe(**merged)
    except ValidationError as exc:
        raise _validation_error(exc.errors(), where_file, sources) from None
    wrong = unknown_keys(recipe.train.allow_changes)  # the whole recipe's keys: checked once it is whole
    if wrong:
        raise _validation_error([{
            "loc": ("train", "allow_changes"), "type": "value_error", "input": recipe.train.allow_changes,
            "msg": f"no such key or section: {', '.join(wrong)}; valid: dotted keys such as 'train.learning_rate', "
                   "a section such as 'algorithm', or '*'"}], where_file, sources)
    name = path.stem if path else "default"
    return Resolved(recipe=recipe, name=name, path=path, sources=sources)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """['train.steps=3', 'data.args={num_samples=10}'] -> nested dict; values parse as TOML. Another
    command line's shape (`learning_rate=1e-6`, `--learning_rate 1e-6`) gets grpo's spelling."""
    from grpocli.recipe.override_hints import check_override_shapes

    check_override_shapes(args)
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(
                f"cannot read the override {arg!r}",
                where="command line",
                valid="section.key=value, e.g. train.learning_rate=2e-6 or data.args={num_samples=100}",
                hint="run `grpo inspect recipe NAME` to see every key",
            )
        _set_dotted(out, key.split("."), _parse_value(raw.strip()))
    return out


def to_toml(recipe: Recipe) -> str:
    """The recipe as TOML, every value spelled out (written to <run>/config.resolved.toml)."""
    return tomli_w.dumps(recipe.model_dump(mode="json", exclude_none=True))


def sources_json(resolved: Resolved, ran: Recipe) -> str:
    """{dotted key: where its value came from} for the keys of ``ran`` (the recipe as it ran) not
    left at their defaults, as JSON (a key not listed is "default"): written to
    <run>/config.sources.json beside config.resolved.toml, so `grpo compare` can say why two runs
    differ. A value the run decided itself (train.num_processes under accelerate, ...) and that
    differs from the recipe's is labelled "set when the run started"."""
    asked = flatten(resolved.recipe)
    out = {}
    for key, value in flatten(ran).items():
        source = resolved.source_of(key) if asked.get(key, value) == value else "set when the run started"
        if source != DEFAULT:
            out[key] = source
    return json.dumps(out, indent=0, sort_keys=True) + "\n"


def flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    """{'train': {'steps': 3}} -> {'train.steps': 3}; lists of tables get [i] keys."""
    if isinstance(values, BaseModel):
        values = values.model_dump(mode="json")
    out: dict[str, Any] = {}
    if isinstance(values, dict) and values:
        for k, v in values.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
        for i, v in enumerate(values):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = values
    return out


def _parse_value(raw: str) -> Any:
    """A TOML value; else JSON (a list or table as JSON); else the text itself (a bare word)."""
    try:
        parsed = tomllib.loads(f"v = {raw}")
        if list(parsed) == ["v"]:  # a newline in the value may not add keys of its own
            return parsed["v"]
    except tomllib.TOMLDecodeError:
        pass
    if raw[:1] in "[{":
        try:
            return json.loads(raw)
        except ValueError:
            pass
    return raw


def _set_dotted(target: dict[str, Any], parts: list[str], value: Any, where: str = "command line") -> None:
    for part in parts[:-1]:
        nxt = target.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise UserError(
                f"{'.'.join(parts)} sets a key inside {part!r}, which already has a value",
                where=where,
            )
        target = nxt
    target[parts[-1]] = value


def _read_toml(path: Path) -> dict[str, Any]:
    """The recipe file's tables; an unreadable, non-UTF-8, invalid or empty file is a UserError."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the recipe: {exc.strerror}", where=str(path)) from None
    text = _decode_utf8(raw, path)
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        from grpocli.recipe.foreign import foreign_config

        foreign = foreign_config(path, text)  # a TRL config (YAML, JSON, .py): the command that imports it
        if foreign is not None:
            raise foreign from None
        raise UserError(
            f"this is not valid TOML: {exc}",
            where=str(path),
            valid="TOML tables [section] with key = value lines; strings in quotes",
            hint=f"fix the line named above, then `grpo inspect recipe {path}` to check it",
        ) from None
    if not values:
        raise UserError(
            "the recipe file sets nothing (it is empty or holds only comments); a run from it would "
            "train the built-in defaults, which is rarely what was meant",
            where=str(path),
            valid="a recipe with at least one [section]; to run the defaults on purpose, a file "
            "holding just the line [train]",
            hint="check that this is the file you meant (an editor that did not save, a truncated "
            "copy), or start from a built-in recipe: `grpo inspect recipes`",
        )
    return values


def _decode_utf8(raw: bytes, path: Path) -> str:
    """``raw`` as text; a byte that is not UTF-8 is named by offset, line and column (TOML is UTF-8)."""
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")  # a BOM, as Windows editors write
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = raw[exc.start : exc.start + 1].hex()
        raise UserError(
            f"the recipe is not UTF-8 text: byte 0x{bad} at offset {exc.start} (line {line}, "
            f"column {column}) cannot be decoded",
            where=f"{path}:{line}",
            valid="TOML files are UTF-8 (the TOML specification); ASCII is UTF-8 too",
            hint=f"re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 {path} > fixed.toml`), "
            f"or fix line {line}",
        ) from None


def _env_values(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The GRPO_SECTION__KEY variables (any case; ``__`` between the parts of a dotted key) whose
    first part is a recipe section, as nested values read like arguments (``_parse_value``). A
    value that does not parse stays text, so the schema names the variable it came from; other
    GRPO_* variables (GRPO_VLLM_API_KEY, GRPO_PLUGINS, ...) are not recipe keys and are left alone."""
    sections = set(Recipe.model_fields)
    out: dict[str, Any] = {}
    for name, raw in sorted((os.environ if environ is None else environ).items()):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if parts[0] not in sections:
            continue
        if any(not part for part in parts):
            raise UserError(
                f"cannot read the environment variable {name}: an empty key between its '__'",
                where=f"env {name}",
                valid="GRPO_SECTION__KEY=value, e.g. GRPO_TRAIN__STEPS=50 or GRPO_MODEL__TINY__NUM_LAYERS=2",
                hint=f"rename it, or `unset {name}`",
            )
        _set_dotted(out, parts, _parse_value(raw.strip()), where=f"env {name}")
    return out


def _merge(dst: dict, sources: dict[str, str], src: dict, label: str, prefix: str) -> None:
    for key, value in src.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and isinstance(dst.setdefault(key, {}), dict) and not _is_free_dict(dotted):
            _merge(dst[key], sources, value, label, dotted)  # each key its own source, set before or not
            continue
        dst[key] = value
        for sub in [k for k in sources if k == dotted or k.startswith(dotted + ".")]:
            del sources[sub]
        for sub_key in flatten(value, dotted) if isinstance(value, (dict, list)) else [dotted]:
            sources[sub_key] = _label(label, dotted, value)


def _is_free_dict(dotted: str) -> bool:
    """Fields that are dicts of the user's own keys are replaced whole, not merged."""
    return dotted.endswith("args")


def _label(label: str, dotted: str, value: Any) -> str:
    if label == "env":
        return "env GRPO_" + "__".join(p.upper() for p in dotted.split("."))
    if label == "argument":
        return f"argument {dotted}={value!r}" if not isinstance(value, dict) else f"argument {dotted}=..."
    return label


def _source_of(sources: dict[str, str], dotted: str) -> str:
    probe = dotted
    while probe:
        if probe in sources:
            return sources[probe]
        if "." not in probe and "[" not in probe:
            break
        probe = probe.rsplit(".", 1)[0] if "." in probe else probe.rsplit("[", 1)[0]
    return DEFAULT


def _validation_error(errors: list[Any], where_file: str, sources: dict[str, str]) -> UserError:
    """The UserError of pydantic's errors (``ValidationError.errors()``), each naming its key and source."""
    lines, valid = [], None
    for err in _union_merged(errors):
        loc = [str(p) for p in err["loc"]]
        dotted = _dotted(loc)
        source = _source_of(sources, dotted)
        msg = err["msg"].removeprefix("Value error, ")  # a validator's own message names the keys and values
        if err["type"] == "extra_forbidden":
            fields = _fields_at(loc[:-1])
            msg = f"unknown key {loc[-1]!r}{did_you_mean(loc[-1], fields)}"
            valid = f"keys of {_dotted(loc[:-1]) or 'the recipe'}: {', '.join(fields)}"
        else:
            desc = _description(loc)
            if desc:
                msg += f" ({desc})"
        shown = f" (got {err['input']!r})" if err["type"] != "extra_forbidden" and _quotable(err) else ""
        origin = f" [from {source}]" if source != DEFAULT else ""
        lines.append(f"{dotted or '(recipe)'}: {msg}{shown}{origin}")
    return UserError(
        "invalid recipe:\n  " + "\n  ".join(lines),
        where=where_file,
        valid=valid,
        hint="fix the key(s) above; `grpo inspect recipe NAME` shows every key, its value and source",
    )


#: The names pydantic gives the members of a union in an error's location (int | Literal["auto"]).
_UNION_MEMBER = re.compile(r"^(constrained-\w+|literal\[.*\]|function-\w+\[.*\]|int|str|float|bool|none)$")


def _union_merged(errors: list[Any]) -> list[Any]:
    """One error per key where a value failed each member of a union ('an integer >= 1, or auto'), its
    location without the members' names."""
    out: list[Any] = []
    by_loc: dict[tuple, Any] = {}
    for err in errors:
        loc = tuple(err["loc"])
        while loc and isinstance(loc[-1], str) and _UNION_MEMBER.match(loc[-1]):
            loc = loc[:-1]
        if loc == tuple(err["loc"]):
            out.append(err)
        elif loc in by_loc:
            merged = by_loc[loc]
            merged["msg"] += " or " + err["msg"].removeprefix("Input should be ")
        else:
            by_loc[loc] = {**err, "loc": loc}
            out.append(by_loc[loc])
    return out


def _quotable(err: Any) -> bool:
    """Whether the error's input is a value worth quoting: not a whole section or recipe (the
    input of a cross-field check, whose message names the keys and values involved itself)."""
    if "input" not in err:
        return False
    value = err["input"]
    return not isinstance(value, dict) and not (isinstance(value, list) and any(isinstance(x, dict) for x in value))


def _dotted(loc: list[str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _walk(loc: list[str]) -> Any:
    """The pydantic model class at a location (skipping list indexes), or None."""
    model: Any = Recipe
    for part in loc:
        if part.isdigit():
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def _fields_at(loc: list[str]) -> list[str]:
    model = _walk(loc)
    return list(getattr(model, "model_fields", {})) if model else []


def _description(loc: list[str]) -> str:
    parent = _walk([p for p in loc[:-1]])
    field = getattr(parent, "model_fields", {}).get(loc[-1]) if parent and loc else None
    return (field.description or "") if field else ""
