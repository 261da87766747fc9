"""How long a run trains, from TRL's ways of saying it: train.num_train_epochs and train.warmup_ratio.

`resolve_duration` turns them into train.steps and train.warmup_steps once the training split's
row count is known (the session calls it before anything is compared or recorded), so
config.resolved.toml holds the steps that ran. TRL's precedence holds: a train.steps that the
recipe, the environment or an argument sets wins over num_train_epochs (TRL's max_steps), and a
warmup_steps above 0 wins over warmup_ratio. A resumed run keeps the warm-up its checkpoint was
trained with when warmup_ratio is unchanged (a longer train.steps does not move a warm-up that is over).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from grpocli.recipe.loader import DEFAULT, Resolved


def epoch_steps(epochs: float, rows: int, prompts_per_step: int, steps_per_generation: int = 1,
                num_iterations: int = 1) -> int:
    """Optimizer steps for ``epochs`` passes over ``rows`` prompts, as TRL counts them (at least 1): an epoch
    is the whole generation batches of prompts_per_step x steps_per_generation prompts it holds (TRL's
    RepeatSampler drops the rest), each trained on for steps_per_generation x num_iterations optimizer steps;
    transformers then takes ceil(epochs x steps per epoch)."""
    batches = rows // (prompts_per_step * steps_per_generation)
    return max(1, math.ceil(epochs * batches * steps_per_generation * num_iterations))


def warmup_steps(ratio: float, steps: int) -> int:
    """TRL's rule (transformers' get_warmup_steps): ceil(ratio x steps)."""
    return math.ceil(ratio * steps)


def resolve_duration(resolved: Resolved, rows: int, saved: dict[str, Any] | None = None) -> tuple[Resolved, list[str]]:
    """The recipe with train.steps and train.warmup_steps worked out, and notes that say how; ``saved``:
    the [train] table of the recipe the checkpoint to resume from was trained with."""
    t = resolved.recipe.train
    update: dict[str, int] = {}
    notes: list[str] = []
    steps = t.steps
    if t.num_train_epochs is not None:
        if resolved.source_of("train.steps") != DEFAULT:
            notes.append(f"train.steps = {t.steps} ({resolved.source_of('train.steps')}) wins over "
                         f"train.num_train_epochs = {t.num_train_epochs:g}, as TRL's max_steps does")
        else:
            mu = resolved.recipe.algorithm.num_iterations
            steps = update["steps"] = epoch_steps(t.num_train_epochs, rows, t.prompts_per_step,
                                                  t.steps_per_generation, mu)
            notes.append(f"train.num_train_epochs = {t.num_train_epochs:g} over {rows} rows: "
                         f"{rows // (t.prompts_per_step * t.steps_per_generation)} generation batches of "
                         f"{t.prompts_per_step} x {t.steps_per_generation} prompts an epoch, each "
                         f"{t.steps_per_generation} x {mu} (num_iterations) optimizer steps, as TRL: "
                         f"train.steps = {steps}")
    if t.warmup_ratio > 0 and t.warmup_steps == 0:
        kept = (saved or {}).get("warmup_steps") if (saved or {}).get("warmup_ratio") == t.warmup_ratio else None
        update["warmup_steps"] = kept if isinstance(kept, int) else warmup_steps(t.warmup_ratio, steps)
        notes.append(f"train.warmup_ratio = {t.warmup_ratio:g}: train.warmup_steps = {update['warmup_steps']}")
    if not update:
        return resolved, notes
    recipe = resolved.recipe.model_copy(update={"train": t.model_copy(update=update)})
    return replace(resolved, recipe=recipe), notes


__all__ = ["epoch_steps", "resolve_duration", "warmup_steps"]
