"""How the training processes share the work: one strategy object, chosen once when training starts.

    strategy.py   Parallel: one process, or DDP over several; what every strategy answers
    sequence.py   SequenceSplit: N processes split each micro-batch's rows (train.sequence_parallel)
    ulysses.py    Ulysses attention: heads exchanged all-to-all, so a split's attention sees the whole row
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
    from grpocli.parallel.sequence import SequenceSplit
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
        strategy: Parallel = DeepSpeed(accelerator, recipe)
    elif sharding == FSDP2:
        strategy = Fsdp2(accelerator, t.mixed_precision)
    else:
        strategy = Parallel(accelerator)
    if t.sequence_parallel > 1:
        strategy.split = open_split(strategy, t.sequence_parallel)
    return strategy


def open_split(strategy: Parallel, size: int) -> SequenceSplit:
    """This process's sequence-parallel split (train.sequence_parallel); UserError for a process count
    it does not divide or a strategy it does not compose with."""
    from grpocli.errors import UserError
    from grpocli.parallel.sequence import SequenceSplit

    if strategy.sharding.startswith("zero"):
        raise UserError(f"train.sequence_parallel = {size} with DeepSpeed {strategy.sharding.upper()}: grpo's "
                        "Ulysses split runs under DDP and FSDP2 only",
                        hint="train.sharding = \"fsdp2\" (FSDP2 shards as ZeRO-3 does), without DeepSpeed's accelerate "
                        "config; or train.sequence_parallel = 1")
    if strategy.size % size:
        fits = [n for n in range(1, strategy.size + 1) if strategy.size % n == 0]
        raise UserError(f"train.sequence_parallel = {size} does not divide the {strategy.size} training "
                        "process(es): each split is that many processes",
                        hint=f"with {strategy.size} process(es): {', '.join(map(str, fits))}; or set "
                        f"train.num_processes to a multiple of {size}")
    return SequenceSplit(size, strategy.rank, strategy.size)


__all__ = ["Parallel", "start"]
