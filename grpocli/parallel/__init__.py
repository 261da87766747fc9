"""How the training processes share the work: one strategy object, chosen once when training starts.

    strategy.py   Parallel: one process, or DDP over several; what every strategy answers
    fsdp2.py      Fsdp2: torch's fully_shard over every process (train.sharding = "fsdp2")
    deepspeed.py  DeepSpeed: ZeRO-2 / ZeRO-3 from accelerate's DeepSpeed config
    adapters.py   a LoRA policy's adapter tensors, under peft's names and the model's (FSDP2 checkpoints)
    status.py     what each process is doing, for a collective that waits too long
    trackers.py   log.report_to: Accelerate's trackers with TRL's key names and project variables

The step, the frozen log-prob passes, generation, evaluation, checkpoints and weight syncs ask
the object `start` returns; no other module tests which strategy runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from grpocli.parallel.strategy import Parallel

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe


def start(recipe: Recipe, project_dir: Path, recipe_name: str = "grpo") -> Parallel:
    """Open accelerate for this process (its launch decides the processes and their group) and
    pick the strategy: DeepSpeed where accelerate's config asks for it, FSDP2 where
    train.sharding or accelerate's config does, else DDP (or one process). UserError for
    combinations that cannot work (FSDP version 1, FSDP2 with DeepSpeed, DeepSpeed settings
    grpo's step cannot honour)."""
    from accelerate import Accelerator

    from grpocli.parallel.deepspeed import DeepSpeed, accelerator_options
    from grpocli.parallel.fsdp2 import FSDP2, Fsdp2, sharding_of
    from grpocli.parallel.trackers import trackers

    t = recipe.train
    accelerator = Accelerator(**accelerator_options(t.collective_timeout), mixed_precision=t.mixed_precision,
                              log_with=trackers(recipe.log.report_to, recipe_name, project_dir) or None,
                              project_dir=str(project_dir))
    sharding = sharding_of(t.sharding, accelerator)
    if accelerator.state.deepspeed_plugin is not None:
        return DeepSpeed(accelerator, recipe)
    if sharding == FSDP2:
        return Fsdp2(accelerator, t.mixed_precision)
    return Parallel(accelerator)


__all__ = ["Parallel", "start"]
