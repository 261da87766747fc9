"""Start training: in this process, or under `accelerate launch` for train.num_processes > 1.

The launcher re-runs the same `grpo train` command line in n processes through torchrun
(accelerate's multi-GPU launcher, which is also the one that starts n processes on CPU:
its `--cpu` launcher starts a single process unless MPI is set up). On a machine without
CUDA each process opens `Accelerator(cpu=True)`, which joins a gloo process group
(DistributedType.MULTI_CPU) and wraps the model in DDP.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from grpocli.recipe import Resolved

#: Set in the environment of launched processes, so that they train instead of launching again.
LAUNCHED = "GRPOCLI_LAUNCHED"  # not GRPO_*: those are recipe keys


def launch(resolved: Resolved, overrides: list[str]) -> None:
    n = resolved.recipe.train.num_processes
    if n > 1 and not _inside_launch():
        _check_run_dir(resolved)  # once, here: not n times, each under a torchrun traceback
        sys.exit(_accelerate_launch(resolved, overrides, n))
    from grpocli.trainer.loop import train

    train(resolved)


def _inside_launch() -> bool:
    return any(k in os.environ for k in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK"))


def _check_run_dir(resolved: Resolved) -> None:
    """The run-directory errors every process would raise (already complete, no such checkpoint)."""
    from grpocli.rundir import RunDir
    from grpocli.trainer.checkpoint import resume_point

    t = resolved.recipe.train
    resume_point(RunDir(resolved.output_dir()), t.resume, t.steps)


def launch_command(resolved: Resolved, overrides: list[str], n: int) -> list[str]:
    """`python -m accelerate.commands.launch --multi_gpu --num_processes n ... -m grpocli.cli.app train ...`."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", resolved.recipe.train.mixed_precision,
           "--dynamo_backend", "no", "--main_process_port", str(_free_port())]
    recipe = str(resolved.path) if resolved.path else None
    return cmd + ["-m", "grpocli.cli.app", "train", *([recipe] if recipe else []), *overrides]


def _accelerate_launch(resolved: Resolved, overrides: list[str], n: int) -> int:
    """Re-run this same `grpo train` under accelerate with n data-parallel processes."""
    return subprocess.call(launch_command(resolved, overrides, n), env={**os.environ, LAUNCHED: "1"})


def _free_port() -> int:
    """A TCP port nobody listens on now, so two runs on one machine do not share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
