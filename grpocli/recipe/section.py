"""The base of every recipe section: unknown keys are refused, assignments validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Field metadata of a key that may change when a run resumes (grpocli.recipe.resume): it says how the
#: run is carried out (where, how long, on which processes, what is logged), not what it computes.
FREE_ON_RESUME = {"resume": "free"}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
