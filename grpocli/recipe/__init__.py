"""Recipes: the schema, the loader with sources, and the built-in catalog. Imports no other grpocli module."""

from grpocli.recipe.loader import (
    Resolved,
    flatten,
    load_recipe,
    parse_overrides,
    to_toml,
)
from grpocli.recipe.schema import Recipe

__all__ = ["Recipe", "Resolved", "flatten", "load_recipe", "parse_overrides", "to_toml"]
