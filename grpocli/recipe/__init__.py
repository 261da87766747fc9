"""Recipes: the schema, the loader with sources, and the built-in catalog.

Below every package but grpocli.algorithms (its variant tables name the accepted losses and
estimators) and grpocli.errors; imports no torch, so `grpo --help` and `grpo inspect` stay light.
"""

from grpocli.recipe.loader import (
    Resolved,
    flatten,
    load_recipe,
    parse_overrides,
    sources_json,
    to_toml,
)
from grpocli.recipe.schema import Recipe

__all__ = ["Recipe", "Resolved", "flatten", "load_recipe", "parse_overrides", "sources_json", "to_toml"]
