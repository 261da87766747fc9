"""The recipe's keys as documentation rows, read from the schema (the one place they are declared)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from grpocli.errors import did_you_mean
from grpocli.recipe.schema import Recipe
from grpocli.recipe.section import FREE_ON_RESUME


def describe(model: type[BaseModel] = Recipe, prefix: str = "", *, free: bool = False) -> list[dict[str, str]]:
    """[{key, type, default, description}] for every leaf key, bounds folded into the type; keys that
    may change when a run resumes (FREE_ON_RESUME, grpocli.recipe.resume) say so."""
    rows: list[dict[str, str]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        free_here = free or field.json_schema_extra == FREE_ON_RESUME
        sub = submodel(field.annotation)
        if sub is not None:  # a section, or a list of [[rewards]] / [[tools]] tables
            rows.extend(describe(sub, key + ("[]." if _is_list(field.annotation) else "."), free=free_here))
            continue
        text = field.description or ""
        rows.append({"key": key, "type": _type(field), "default": _default(field),
                     "description": text + (" May change on resume." if free_here else "")})
    return rows


def submodel(annotation: Any) -> type[BaseModel] | None:
    for cand in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def _is_list(annotation: Any) -> bool:
    """A list of tables ([[rewards]], [[tools]], [[data.sources]]), whose keys are written name[].key."""
    return getattr(annotation, "__origin__", None) is list


def _type(field: Any) -> str:
    text = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    bounds = [f"{sym}{getattr(m, attr)}" for m in field.metadata
              for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if hasattr(m, attr)]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        return repr(field.default)
    if field.default_factory is not None:
        value = field.default_factory()
        return repr(value) if not isinstance(value, BaseModel) else "(section)"
    return "(required)"


def every_key(model: type[BaseModel] = Recipe, prefix: str = "") -> list[str]:
    """Every section and key of the recipe, dotted ('train', 'train.learning_rate', 'rewards.name', ...)."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + name
        keys.append(key)
        sub = submodel(field.annotation)
        if sub is not None:
            keys.extend(every_key(sub, key + "."))
    return keys


def unknown_keys(keys: list[str]) -> list[str]:
    """The entries of train.allow_changes that name no key or section, each with a did-you-mean."""
    every = every_key()
    return [f"{k!r}{did_you_mean(k, every)}" for k in keys if k != "*" and k not in every]
