"""What a resume counts as a change of the recipe (grpocli.recipe.resume.changes)."""

from __future__ import annotations

import re

from grpocli.recipe import load_recipe
from grpocli.recipe.loader import to_toml
from grpocli.recipe.resume import changes


def _without_table(text: str, table: str) -> str:
    """The TOML text without one [table] (what an older grpo, which had no such section, wrote)."""
    return re.sub(rf"(?ms)^\[{re.escape(table)}\]\n.*?(?=^\[|\Z)", "", text)


def test_a_section_an_older_grpo_did_not_write_is_no_change_at_its_defaults():
    recipe = load_recipe("quickstart").recipe
    saved = _without_table(to_toml(recipe), "distill")
    assert "[distill]" not in saved and "[distill]" in to_toml(recipe)
    assert changes(saved, recipe) == []


def test_a_new_key_set_away_from_its_default_is_a_change():
    recipe = load_recipe("quickstart", ["distill.teacher=some-teacher"]).recipe
    saved = _without_table(to_toml(load_recipe("quickstart").recipe), "distill")
    found = changes(saved, recipe)
    assert [c.key for c in found] == ["distill.teacher"] and not found[0].free
