"""Start training: in this process, or under `accelerate launch` for train.num_processes > 1."""

from __future__ import annotations

import os
import subprocess
import sys

from grpocli.recipe import Resolved


def launch(resolved: Resolved, overrides: list[str]) -> None:
    n = resolved.recipe.train.num_processes
    if n > 1 and "WORLD_SIZE" not in os.environ:
        sys.exit(_accelerate_launch(resolved, overrides, n))
    from grpocli.trainer.loop import train

    train(resolved)


def _accelerate_launch(resolved: Resolved, overrides: list[str], n: int) -> int:
    """Re-run this same `grpo train` under accelerate with n data-parallel processes."""
    import torch

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", resolved.recipe.train.mixed_precision,
           "--dynamo_backend", "no"]
    if not torch.cuda.is_available():
        cmd.append("--cpu")
    recipe = str(resolved.path) if resolved.path else None
    cmd += ["-m", "grpocli.cli.app", "train", *([recipe] if recipe else []), *overrides]
    return subprocess.call(cmd)
