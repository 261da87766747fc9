"""A reward that breaks the run it scores, on purpose (tests/trainer/test_guard_runs.py names it as
`tests/trainer/data/guard_faults.py:explode`): the faults train.guard is for, made from inside a real run."""

from __future__ import annotations

import gc
import math
from pathlib import Path


def explode(prompts, completions, trainer_state=None, at_step: int = 2, lr: float = math.inf, once: str = "",
            **kwargs):
    """NaN for every completion (grpo reads a NaN reward as no reward, TRL's nansum: it trips nothing), and
    when the run has taken `at_step` steps, the first time only (the file `once` marks it, so a rolled-back
    run does not explode again), the optimizer's learning rate set to `lr` for its next update: an exploding
    learning rate (the schedule sets its own again after that update)."""
    marker = Path(once) if once else None
    if trainer_state is not None and trainer_state.global_step == at_step and not (marker and marker.exists()):
        import warnings

        import torch

        with warnings.catch_warnings():  # isinstance on torch's deprecated module attributes warns
            warnings.simplefilter("ignore")
            optimizers = [obj for obj in gc.get_objects() if isinstance(obj, torch.optim.Optimizer)]
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        if marker is not None:
            marker.write_text(f"exploded at step {at_step}\n")
    return [math.nan] * len(completions)
