"""The base of every recipe section: unknown keys are refused, assignments validated, numbers
finite (a field that means "no bound" by inf says so with allow_inf_nan=True), and values taken
as they are written (strict): `true` is no integer and `1` no boolean, so `train.steps=true` or
`model.trust_remote_code=1` is named instead of read as 1 and true. Integers are accepted where
a float is asked (`learning_rate = 1`), as TOML writes them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Field metadata of a key that may change when a run resumes (grpocli.recipe.resume): it says how the
#: run is carried out (where, how long, on which processes, what is logged), not what it computes.
FREE_ON_RESUME = {"resume": "free"}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)
