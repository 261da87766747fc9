"""What may change when a run resumes, and what may not.

A resumed run goes on with the math of the steps before it: a different learning rate, seed,
group size, batch, KL coefficient or loss would make its later steps train something the run's
record does not say. So the recipe of the checkpoint a run resumes from (saved with it as
``trainer/recipe.toml``; older checkpoints: the run's config.resolved.toml) is compared with the
recipe of the command, key by key:

* keys marked ``FREE_ON_RESUME`` in the schema (and every key under such a field) say how the run is
  carried out, not what it computes (train.steps, save_steps, log.*, eval.*, the processes, the
  vLLM server's address ...): they may change;
* any other key that differs is refused before a model loads, naming it with both values, unless
  ``train.allow_changes`` names it (or its section, or '*').

Whatever changed, the config the earlier part ran with is kept in ``<run>/history/`` (the session
writes it), so config.resolved.toml never stands for steps it did not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel

from grpocli.errors import UserError
from grpocli.recipe.fields import submodel
from grpocli.recipe.loader import Resolved, flatten
from grpocli.recipe.schema import Recipe
from grpocli.recipe.section import FREE_ON_RESUME

#: Where a checkpoint keeps the recipe it was trained with (written by grpocli.trainer.checkpoint).
SAVED_RECIPE = "trainer/recipe.toml"
ABSENT = "(not set)"


@dataclass(frozen=True)
class Change:
    key: str       # dotted, lists of tables as rewards[0].name
    before: Any    # the checkpoint's value (ABSENT where it had none)
    after: Any     # the command's
    free: bool     # a key that may change on resume

    def render(self) -> str:
        return f"{self.key} {_show(self.before)} -> {_show(self.after)}"


def saved_recipe(checkpoint: Path, run_config: Path) -> tuple[Path, str] | None:
    """(where, TOML text) of the recipe ``checkpoint`` was trained with; None when none was kept."""
    for path in (checkpoint / SAVED_RECIPE, run_config):
        try:
            return path, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None


def changes(saved_toml: str, recipe: Recipe) -> list[Change]:
    """Every key whose value differs between the saved recipe and ``recipe``. A key the saved recipe lacks
    that ``recipe`` holds at its default is no change: the run was saved by a grpo without that key (a
    new key's default is the old behaviour)."""
    before = flatten(tomllib.loads(saved_toml))
    after = flatten(recipe.model_dump(mode="json", exclude_none=True))
    defaults = flatten(Recipe().model_dump(mode="json", exclude_none=True)) if set(after) - set(before) else {}
    return [Change(key, before.get(key, ABSENT), after.get(key, ABSENT), is_free(key))
            for key in sorted(set(before) | set(after)) if before.get(key, ABSENT) != after.get(key, ABSENT)
            and not (key not in before and after[key] == defaults.get(key, ABSENT))]


def check_resume(resolved: Resolved, checkpoint: Path, run_config: Path) -> list[Change]:
    """The changes of this resume (UserError for any the recipe may not make), before any model loads."""
    saved = saved_recipe(checkpoint, run_config)
    if saved is None:
        return []
    where, text = saved
    try:
        found = changes(text, resolved.recipe)
    except (tomllib.TOMLDecodeError, ValueError):
        return []  # a damaged record: resume goes on (the checkpoint itself was checked)
    allowed = resolved.recipe.train.allow_changes
    refused = [c for c in found if not c.free and not _allowed(c.key, allowed)]
    if refused:
        keys = [c.key for c in refused]
        listed = ", ".join(f'"{k}"' for k in sorted({*allowed, *keys}))
        raise UserError(
            f"the recipe changes how the run trains, resuming from {checkpoint}: "
            + "; ".join(c.render() for c in refused) + f" (the checkpoint was trained with {where})",
            where="train.resume",
            valid="the values the run was trained with; keys such as train.steps, train.save_steps, log.* and "
            "eval.* may change on resume (`grpo inspect fields train` marks them)",
            hint=f"put the old values back, or allow the change: train.allow_changes='[{listed}]' (the config of "
            f"each part of the run is kept in {Path(run_config).parent / 'history'}), or start a new run: "
            f"train.output_dir={Path(run_config).parent}-new",
        )
    return found


def is_free(dotted: str) -> bool:
    """Whether a key (or a field above it) is marked FREE_ON_RESUME in the schema."""
    model: type[BaseModel] | None = Recipe
    for part in _parts(dotted):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return False  # a key the schema no longer has, or a free-form table (data.args)
        if field.json_schema_extra == FREE_ON_RESUME:
            return True
        model = submodel(field.annotation)
    return False


def _allowed(key: str, allowed: list[str]) -> bool:
    plain = ".".join(_parts(key))
    return any(a == "*" or plain == a or plain.startswith(a + ".") for a in allowed)


def _parts(dotted: str) -> list[str]:
    """'rewards[0].timeout' -> ['rewards', 'timeout']."""
    return [p.split("[", 1)[0] for p in dotted.split(".")]


def _show(value: Any) -> str:
    return value if value is ABSENT else repr(value)
