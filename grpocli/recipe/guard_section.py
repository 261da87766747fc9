"""[train.guard]: what a run does when a step goes wrong (a non-finite loss or gradient norm, KL past a
bound, entropy collapsing). Declared here, wired into [train] as ``train.guard`` (grpocli.recipe.train_section);
the trainer acts on it (grpocli.trainer.guard). docs/faults.md says what each action does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from grpocli.recipe.section import Section

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

GuardAction = Literal["skip", "rollback", "stop"]


class GuardSection(Section):
    action: GuardAction = Field(
        "skip",
        description="What a tripped check does. 'skip': a non-finite step's update is not applied (it never is), "
        "and a KL or entropy trip is noted (a line, guard/tripped in metrics.jsonl) and training goes on with that "
        "update applied; 'rollback': restore the newest checkpoint before the bad step (weights, optimizer, "
        "schedule, random state, data position: what a resume from it restores) with the learning rate times "
        "rollback_lr_scale, move the discarded steps' metrics and rollouts to <run>/discarded/rollback-K/, and "
        "go on (needs train.save_steps > 0); 'stop': exit 2 naming the step, the metric, its value and the key.",
    )
    max_kl: float | None = Field(
        None, gt=0.0, le=1e6,
        description="Trip when a step's kl (to the reference model: needs algorithm.beta > 0) is above this. "
        "None: off.",
    )
    min_entropy: float | None = Field(
        None, gt=0.0, le=1e3,
        description="Trip when a step's entropy (nats per loss token) has been below this for entropy_patience "
        "steps in a row (a collapsed policy). None: off.",
    )
    entropy_patience: int = Field(
        3, ge=1, le=100000, description="Consecutive steps with entropy below min_entropy before the guard trips.",
    )
    rollback_lr_scale: float = Field(
        0.5, gt=0.0, le=1.0,
        description="Each rollback multiplies the learning rate by this (compounding: 0.5, then 0.25, ...); the "
        "scale is saved with later checkpoints, so a resume keeps it.",
    )
    max_rollbacks: int = Field(
        3, ge=1, le=1000,
        description="Rollbacks one run directory may take (the folders <run>/discarded/rollback-K/); a trip "
        "after that many stops the run with exit 2.",
    )


def check_guard(recipe: Recipe) -> None:
    """ValueError for guard settings that cannot work together with the rest of the recipe (the schema
    reports it naming the keys, before any model loads)."""
    train, algorithm, generation = recipe.train, recipe.algorithm, recipe.generation
    g = train.guard
    if g.max_kl is not None and algorithm.beta == 0:
        raise ValueError(
            f"train.guard.max_kl = {g.max_kl:g} watches the KL to the reference model, which algorithm.beta = 0 "
            "never computes (kl stays 0); valid: algorithm.beta > 0 (e.g. 0.04) with max_kl, or max_kl unset"
        )
    if g.action != "rollback":
        return
    if train.save_steps == 0:
        raise ValueError(
            "train.guard.action = 'rollback' restores the newest checkpoint, but train.save_steps = 0 writes one "
            "only at the end of the run, so there would be none to roll back to; valid: train.save_steps = N > 0 "
            "(a checkpoint every N steps), or train.guard.action = 'skip' or 'stop'"
        )
    ahead = ("generation.async_steps > 0" if generation.async_steps else
             "generation.pipeline = 'inflight'" if generation.pipeline == "inflight" else None)
    if ahead:
        raise ValueError(
            f"train.guard.action = 'rollback' with {ahead}: completions generated ahead of the rolled-back "
            "steps would be trained after it; valid: rollback with generation.async_steps = 0 and "
            "generation.pipeline = 'sync', or train.guard.action = 'skip' or 'stop'"
        )
