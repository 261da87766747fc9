"""Start training: in this process, or in n data-parallel processes.

Ways in, and what each one does:

* `grpo train R train.num_processes=n` (n > 1, no launcher around it) re-runs the same command
  line under `accelerate launch --multi_gpu --num_processes n`: torchrun, the launcher that
  starts n processes on CPU too. On a machine without CUDA each process opens
  `Accelerator(cpu=True)`, which joins a gloo group (DistributedType.MULTI_CPU) and wraps the
  model in DDP. grpo runs accelerate's launcher inside its own (grpocli.launch.processes), so
  that killing `grpo train` in any way kills the launcher and the workers too, and a worker's
  user error is printed once (exit 2) without torchrun's report.
* A process torchrun started (`accelerate launch --multi_gpu`, a config file's MULTI_GPU, GPUs
  found, or the re-run above; WORLD_SIZE is set), or one of an MPI job: trains as one of them.
* A process accelerate's one-process launcher started: `accelerate launch --cpu
  --num_processes n`, or `--num_processes n` without `--multi_gpu` on a machine without GPUs.
  That launcher starts one process whatever --num_processes says (several need MPI). When it
  was asked for n > 1, this process starts the n processes itself as in the first case (its
  command line is read from /proc: the parent process). Where that cannot work (several
  machines; one GPU without --cpu) or the request cannot be read, it stops (exit 2) naming the
  command that works. Under `accelerate launch` an exit 2 is followed by accelerate's own
  CalledProcessError traceback unless it was given --quiet.

The run directory is locked (grpocli.launch.lock) by the process the user started, for the
whole run: `grpo train` here, also when it launches n processes (they do not lock), or the main
process under a launcher grpo did not start.

The launcher decides how many processes run; the run's config.resolved.toml records the number
that ran (`train.num_processes`) and the mixed precision that was used.

Under `accelerate launch`, what that launch was asked for (its command line, its config file)
and the mixed precision the run uses are settled by grpocli.launch.request.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable

from grpocli.errors import Stopped, UserError
from grpocli.launch.processes import LAUNCHED, LAUNCHER
from grpocli.launch.request import (
    AccelerateRequest,
    accelerate_request,
    default_source,
    settle_mixed_precision,
    started_by_accelerate,
    with_train,
)
from grpocli.recipe import Resolved

#: World sizes an MPI launcher sets (accelerate's `--mpirun_hostfile`); accelerate reads them too.
MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launch(resolved: Resolved, overrides: list[str], train: Callable[[Resolved], None]) -> None:
    """Run `train(resolved)` here, or start the processes that run it (each runs `grpo train`
    with `overrides`); the run directory is locked meanwhile (grpocli.launch.lock) by the process
    that was started by the user."""
    from grpocli.launch.processes import worker

    if _inside_launch():  # one of several: dies with its launcher, says its errors once
        with worker(), _main_process_lock(resolved):
            resolved = settle_mixed_precision(resolved, accelerate_request())
            _check_split(resolved, _world_size())
            train(_adopt_world_size(resolved, _world_size()))
        return
    with _lock(resolved):  # before anything reads or writes the run
        request = accelerate_request()
        resolved = settle_mixed_precision(resolved, request)
        n = _processes_to_start(resolved, overrides, request)
        _check_split(resolved, n)
        if n == 1:
            train(resolved)
            return
        _check_run_dir(resolved)  # once, here: not n times
        if n != resolved.recipe.train.num_processes:
            if resolved.source_of("train.num_processes") != default_source():
                _note(f"accelerate was asked for {n} processes; the recipe says train.num_processes = "
                      f"{resolved.recipe.train.num_processes}. " + batch_on(resolved, n))
            overrides = [*_without_num_processes(overrides), f"train.num_processes={n}"]
        try:
            code = _accelerate_launch(resolved, overrides, n)
        except Stopped as stop:  # the workers stopped on a signal: say what the run kept
            from grpocli.rundir import RunDir, stopped_run

            raise Stopped(stop.signum, kept=stopped_run(RunDir(resolved.output_dir()))) from None
    if code:
        sys.exit(code)


def reports_the_run() -> bool:
    """Whether this process tells the user how the run ended: the one the user started, or the main
    process of a launcher grpo did not start (torchrun, MPI); not one of the processes grpo launched."""
    return LAUNCHED not in os.environ and _global_rank() == 0


def _lock(resolved: Resolved):
    from grpocli.launch.lock import run_lock
    from grpocli.rundir import RunDir

    return run_lock(RunDir(resolved.output_dir()))


def _main_process_lock(resolved: Resolved):
    """The lock, in the main process of a launcher grpo did not start (torchrun, MPI); the
    processes `grpo train` launched leave it to `grpo train`, the other ranks to their main one."""
    import contextlib

    if LAUNCHED in os.environ or _global_rank() != 0:
        return contextlib.nullcontext()
    return _lock(resolved)


def _global_rank() -> int:
    for key in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def _inside_launch() -> bool:
    """Started by torchrun (ours or the user's) or MPI: one of several processes already."""
    return any(k in os.environ for k in (LAUNCHED, "WORLD_SIZE", "LOCAL_RANK")) or _mpi_size() > 1


def _mpi_size() -> int:
    for key in MPI_SIZES:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def _world_size() -> int:
    size = os.environ.get("WORLD_SIZE", "")
    return int(size) if size.isdigit() else _mpi_size()


def _processes_to_start(resolved: Resolved, overrides: list[str], request: AccelerateRequest | None) -> int:
    """How many processes to start from here: the recipe's, or what accelerate's one-process
    launcher was asked for (it starts one whatever --num_processes says)."""
    wanted = resolved.recipe.train.num_processes
    if not started_by_accelerate():
        return wanted
    asked = request.num_processes if request is not None else None
    if request is None and "MASTER_ADDR" in os.environ and wanted == 1:
        # its command line is unreadable here; its one-process launcher sets MASTER_ADDR only
        # when asked for several processes (or machines)
        raise UserError(
            "`accelerate launch` was asked for several processes but started one: its one-process "
            "launcher (--cpu, or no --multi_gpu on a machine without GPUs) ignores --num_processes "
            "unless MPI is set up",
            valid="a launcher that starts N processes, on CPU too",
            hint=f"{_grpo_command(resolved, overrides)} train.num_processes=N   or   "
            f"accelerate launch --multi_gpu --num_processes N {_accelerate_tail(resolved, overrides)}",
        )
    if asked is None or asked <= 1:
        return wanted
    if request is not None and request.num_machines > 1:
        raise UserError(
            f"`accelerate launch` was asked for {asked} processes on {request.num_machines} machines, "
            "but its one-process launcher (--cpu, or no --multi_gpu on a machine without GPUs) starts "
            "a single process on each unless MPI is set up (--mpirun_hostfile)",
            valid="torchrun on every machine: accelerate launch --multi_gpu",
            hint=f"accelerate launch --multi_gpu --num_machines {request.num_machines} --machine_rank R "
            f"--main_process_ip HOST --num_processes {asked} {_accelerate_tail(resolved, overrides)}",
        )
    if asked != wanted and resolved.source_of("train.num_processes") != default_source():
        _note(f"accelerate launch asks for {asked} processes; train.num_processes = {wanted} "
              f"({resolved.source_of('train.num_processes')}) does not apply")
    gpus = _visible_gpus()
    if gpus and not _flag(os.environ.get("ACCELERATE_USE_CPU", "")):
        raise UserError(
            f"`accelerate launch` was asked for {asked} processes but started one: this machine shows "
            f"{gpus} GPU, and accelerate starts one process per GPU",
            where="accelerate launch --num_processes",
            valid=f"--num_processes 1 on {gpus} GPU, or --cpu for {asked} CPU processes",
            hint=f"accelerate launch --cpu --num_processes {asked} {_accelerate_tail(resolved, overrides)}",
        )
    _check_prompts_divide(resolved, asked, "accelerate launch --num_processes")
    _note(f"accelerate launch's one-process launcher (--cpu, or no --multi_gpu without GPUs) starts "
          f"a single process; starting {asked} through `accelerate launch --multi_gpu` (torchrun)")
    return asked


def _adopt_world_size(resolved: Resolved, world: int) -> Resolved:
    """The recipe as the processes that run see it: train.num_processes = the launcher's count."""
    t = resolved.recipe.train
    if world == t.num_processes:
        return resolved
    if resolved.source_of("train.num_processes") != default_source() and os.environ.get("RANK", "0") == "0":
        _note(f"the launcher started {world} processes; train.num_processes = {t.num_processes} "
              f"({resolved.source_of('train.num_processes')}) does not apply. " + batch_on(resolved, world))
    _check_prompts_divide(resolved, world, "the launcher's process count")
    return with_train(resolved, "num_processes", world, "launcher")


def batch_on(resolved: Resolved, m: int) -> str:
    """What a step holds on ``m`` processes for a recipe written for train.num_processes = N (as `grpo import
    trl --num-processes N` writes it): grpo's step keeps its prompts, TRL's per-device batch would not."""
    t = resolved.recipe.train
    p, n = t.prompts_per_step, t.num_processes
    trl = f"{p * m // n}" if (p * m) % n == 0 else f"{p * m / n:g}"
    return (f"A step keeps train.prompts_per_step = {p} prompts over all {m} processes ({p / m:g} each); "
            f"TRL's per-device batch written for {n} would give {trl} on {m}: set train.prompts_per_step={trl} "
            "for TRL's")


def _check_prompts_divide(resolved: Resolved, n: int, where: str) -> None:
    per_step = resolved.recipe.train.prompts_per_step
    if per_step % n:
        raise UserError(
            f"train.prompts_per_step = {per_step} must divide evenly over the {n} processes "
            "(each process samples whole groups)",
            where=where,
            valid=f"prompts_per_step: multiples of {n}",
            hint=f"train.prompts_per_step={per_step + n - per_step % n}, or launch a number of "
            f"processes that divides {per_step}",
        )


def _check_split(resolved: Resolved, n: int) -> None:
    """train.sequence_parallel divides the processes, before any model loads."""
    size = resolved.recipe.train.sequence_parallel
    if n % size:
        fits = [k for k in range(1, n + 1) if n % k == 0]
        raise UserError(
            f"train.sequence_parallel = {size} does not divide the {n} training process(es): each split of a "
            "sequence is that many processes",
            where="train.sequence_parallel",
            valid=f"with {n} process(es): {', '.join(map(str, fits))}",
            hint=f"train.sequence_parallel={max(k for k in fits if k <= size)} on {n} process(es), or "
            f"train.num_processes={size * -(-n // size)} for a split of {size}",
        )


# -- starting n processes --------------------------------------------------------------------
def _check_run_dir(resolved: Resolved) -> None:
    """The run-directory errors every process would raise (already complete, no such checkpoint, a
    changed recipe)."""
    from grpocli.recipe.resume import check_resume
    from grpocli.rundir import RunDir, resume_point

    t, run = resolved.recipe.train, RunDir(resolved.output_dir())
    found = resume_point(run, t.resume, t.steps)
    if found is not None:
        check_resume(resolved, found[1], run.config)


def launch_command(resolved: Resolved, overrides: list[str], n: int,
                   command: list[str] | None = None) -> list[str]:
    """`python -m grpocli.launch.processes --multi_gpu --num_processes n ... -m grpocli.cli.app train ...`:
    accelerate launch's arguments, run by grpo's launcher (grpocli.launch.processes); `command`: the grpo
    command each process runs instead of `train RECIPE OVERRIDES` (`grpo bench` on several processes)."""
    cmd = [sys.executable, "-m", LAUNCHER, "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", resolved.recipe.train.mixed_precision,
           "--dynamo_backend", "no", "--main_process_port", str(_free_port())]
    recipe = str(resolved.path) if resolved.path else None
    return cmd + ["-m", "grpocli.cli.app", *(command or ["train", *([recipe] if recipe else []), *overrides])]


def _accelerate_launch(resolved: Resolved, overrides: list[str], n: int) -> int:
    """Re-run this same `grpo train` under accelerate with n data-parallel processes."""
    from grpocli.launch.processes import run_launcher

    return run_launcher(launch_command(resolved, overrides, n), env={**os.environ, LAUNCHED: "1"})


def _free_port() -> int:
    """A TCP port nobody listens on now, so two runs on one machine do not share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- small pieces ----------------------------------------------------------------------------
def _grpo_command(resolved: Resolved, overrides: list[str]) -> str:
    return " ".join(["grpo", "train", _recipe_arg(resolved), *_quoted(overrides)])


def _accelerate_tail(resolved: Resolved, overrides: list[str]) -> str:
    return " ".join(["-m", "grpocli.cli.app", "train", _recipe_arg(resolved), *_quoted(overrides)])


def _recipe_arg(resolved: Resolved) -> str:
    """The recipe as a user types it: a built-in's name, else its path."""
    from grpocli.recipe import catalog

    if resolved.path is not None and catalog.builtin().get(resolved.name) == resolved.path:
        return resolved.name
    return str(resolved.path or resolved.name)


def _quoted(args: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in _without_num_processes(args)]


def _without_num_processes(overrides: list[str]) -> list[str]:
    return [a for a in overrides if not a.startswith("train.num_processes=")]


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "y", "on")


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)
