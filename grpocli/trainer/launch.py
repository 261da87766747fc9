"""Start training: in this process, or in n data-parallel processes.

Ways in, and what each one does:

* `grpo train R train.num_processes=n` (n > 1, no launcher around it) re-runs the same command
  line under `accelerate launch --multi_gpu --num_processes n`: torchrun, the launcher that
  starts n processes on CPU too. On a machine without CUDA each process opens
  `Accelerator(cpu=True)`, which joins a gloo group (DistributedType.MULTI_CPU) and wraps the
  model in DDP. grpo runs accelerate's launcher inside its own (grpocli.trainer.processes), so
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

The run directory is locked (grpocli.trainer.lock) by the process the user started, for the
whole run: `grpo train` here, also when it launches n processes (they do not lock), or the main
process under a launcher grpo did not start.

The launcher decides how many processes run; the run's config.resolved.toml records the number
that ran (`train.num_processes`) and the mixed precision that was used.

Mixed precision under `accelerate launch`: accelerate hands its choice (its --mixed_precision,
else its config file, else "no") to the processes as ACCELERATE_MIXED_PRECISION. Where it and the
recipe's `train.mixed_precision` differ, the one that was set explicitly is used: accelerate's
when it asks for bf16/fp16 or was given --mixed_precision, the recipe's when a recipe file,
GRPO_TRAIN__MIXED_PRECISION or an argument set it. Both set and different: exit 2, naming both.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path

from grpocli.errors import UserError
from grpocli.recipe import Resolved

#: Set in the environment of launched processes, so that they train instead of launching again.
LAUNCHED = "GRPOCLI_LAUNCHED"  # not GRPO_*: those are recipe keys
#: World sizes an MPI launcher sets (accelerate's `--mpirun_hostfile`); accelerate reads them too.
MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
#: The module `grpo train` runs as its launcher: accelerate launch, quiet about failed workers.
LAUNCHER = "grpocli.trainer.processes"
#: Set by every `accelerate launch` launcher in the processes it starts.
ACCELERATE_PRECISION = "ACCELERATE_MIXED_PRECISION"


@dataclasses.dataclass(frozen=True)
class AccelerateRequest:
    """What the `accelerate launch` that started this process was asked for (its command line)."""

    num_processes: int | None    # None: neither --num_processes nor its config file says
    num_machines: int            # --num_machines, else its config file's, else 1
    mixed_precision_from: str    # where accelerate's mixed precision came from, in words
    mixed_precision_flag: bool   # --mixed_precision was given on its command line


def launch(resolved: Resolved, overrides: list[str]) -> None:
    """Train here, or start the processes that train; the run directory is locked meanwhile
    (grpocli.trainer.lock) by the process that was started by the user."""
    from grpocli.trainer.processes import worker

    if _inside_launch():  # one of several: dies with its launcher, says its errors once
        with worker(), _main_process_lock(resolved):
            resolved = settle_mixed_precision(resolved, accelerate_request())
            _train(_adopt_world_size(resolved, _world_size()))
        return
    with _lock(resolved):  # before anything reads or writes the run
        request = accelerate_request()
        resolved = settle_mixed_precision(resolved, request)
        n = _processes_to_start(resolved, overrides, request)
        if n == 1:
            _train(resolved)
            return
        _check_run_dir(resolved)  # once, here: not n times
        if n != resolved.recipe.train.num_processes:
            overrides = [*_without_num_processes(overrides), f"train.num_processes={n}"]
        code = _accelerate_launch(resolved, overrides, n)
    sys.exit(code)


def _train(resolved: Resolved) -> None:
    from grpocli.trainer.loop import train

    train(resolved)


def _lock(resolved: Resolved):
    from grpocli.rundir import RunDir
    from grpocli.trainer.lock import run_lock

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


def _started_by_accelerate() -> bool:
    return ACCELERATE_PRECISION in os.environ


def _processes_to_start(resolved: Resolved, overrides: list[str], request: AccelerateRequest | None) -> int:
    """How many processes to start from here: the recipe's, or what accelerate's one-process
    launcher was asked for (it starts one whatever --num_processes says)."""
    wanted = resolved.recipe.train.num_processes
    if not _started_by_accelerate():
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
    if asked != wanted and resolved.source_of("train.num_processes") != _default():
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
    if resolved.source_of("train.num_processes") != _default() and os.environ.get("RANK", "0") == "0":
        _note(f"the launcher started {world} processes; train.num_processes = {t.num_processes} "
              f"({resolved.source_of('train.num_processes')}) does not apply")
    _check_prompts_divide(resolved, world, "the launcher's process count")
    return _with_train(resolved, "num_processes", world, "launcher")


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


# -- mixed precision -------------------------------------------------------------------------
def settle_mixed_precision(resolved: Resolved, request: AccelerateRequest | None) -> Resolved:
    """The recipe with the mixed precision this run uses (see the module's docstring)."""
    theirs = os.environ.get(ACCELERATE_PRECISION)
    ours = resolved.recipe.train.mixed_precision
    if theirs is None or theirs.lower() == ours:
        return resolved
    theirs = theirs.lower()
    flag = request is not None and request.mixed_precision_flag
    where = request.mixed_precision_from if request is not None else f"{ACCELERATE_PRECISION}={theirs}"
    ours_from = resolved.source_of("train.mixed_precision")
    theirs_set, ours_set = theirs != "no" or flag, ours_from != _default()
    if theirs_set and ours_set:
        raise UserError(
            f"train.mixed_precision = {ours!r} ({ours_from}) but accelerate's mixed precision is "
            f"{theirs!r} ({where})",
            where="mixed precision",
            valid="the same value in both, or set in one of them only",
            hint=f"train.mixed_precision={theirs} (or leave it out of the recipe), or "
            f"accelerate launch --mixed_precision {ours} ...",
        )
    if not theirs_set:
        return resolved
    if theirs not in ("no", "bf16", "fp16"):
        raise UserError(f"accelerate's mixed precision {theirs!r} ({where}) is not one grpo trains with",
                        where="mixed precision", valid="no, bf16, fp16",
                        hint="accelerate launch --mixed_precision bf16 (or set train.mixed_precision)")
    return _with_train(resolved, "mixed_precision", theirs, where)


# -- the accelerate launch that started this process ----------------------------------------
def accelerate_request(argv: list[str] | None = None) -> AccelerateRequest | None:
    """Read the parent `accelerate launch` command line (Linux /proc); None where it cannot be."""
    if argv is None:
        if not _started_by_accelerate():
            return None
        argv = _accelerate_argv(_parent_argv())
    if argv is None:
        return None
    try:
        from accelerate.commands.launch import launch_command_parser

        args = launch_command_parser().parse_args(argv)
    except (ImportError, SystemExit):  # its own parser accepted it; another version might not
        return None
    config = _config_file(args)
    n, machines, precision = args.num_processes, args.num_machines, None
    if config is not None:
        try:
            from accelerate.commands.config.config_args import load_config_from_file

            loaded = load_config_from_file(str(config))
            n = n if n is not None else loaded.num_processes
            machines = machines if machines is not None else loaded.num_machines
            precision = loaded.mixed_precision
        except (ImportError, OSError, ValueError, TypeError, KeyError):
            config = None  # accelerate read it; where this version cannot, its values stay unknown
    if args.mixed_precision is not None:
        where = f"accelerate launch --mixed_precision {args.mixed_precision}"
    elif config is not None and precision is not None:
        where = f"accelerate config file {config}"
    else:
        where = "accelerate's default"
    n = n if isinstance(n, int) and n >= 1 else None
    machines = machines if isinstance(machines, int) and machines >= 1 else 1
    return AccelerateRequest(num_processes=n, num_machines=machines, mixed_precision_from=where,
                             mixed_precision_flag=args.mixed_precision is not None)


def _config_file(args) -> Path | None:
    """The config file accelerate launch read: --config_file, else its default one (not with --cpu)."""
    if args.config_file is not None:
        return Path(args.config_file)
    try:
        from accelerate.commands.config import default_config_file
    except ImportError:
        return None
    return Path(default_config_file) if os.path.isfile(default_config_file) and not args.cpu else None


def _parent_argv() -> list[str] | None:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    raw = raw[:-1] if raw.endswith(b"\0") else raw
    return [part.decode(errors="replace") for part in raw.split(b"\0")] if raw else None


def _accelerate_argv(argv: list[str] | None) -> list[str] | None:
    """The arguments after `accelerate launch` / `accelerate-launch` / `-m accelerate.commands.launch`."""
    for i, part in enumerate(argv or []):
        name = Path(part).name
        if part in ("accelerate.commands.launch", LAUNCHER) or name == "accelerate-launch":
            return argv[i + 1 :]
        if part == "launch" and i > 0 and Path(argv[i - 1]).name in ("accelerate", "accelerate.commands.accelerate_cli"):
            return argv[i + 1 :]
    return None


# -- starting n processes --------------------------------------------------------------------
def _check_run_dir(resolved: Resolved) -> None:
    """The run-directory errors every process would raise (already complete, no such checkpoint)."""
    from grpocli.rundir import RunDir
    from grpocli.trainer.checkpoint import resume_point

    t = resolved.recipe.train
    resume_point(RunDir(resolved.output_dir()), t.resume, t.steps)


def launch_command(resolved: Resolved, overrides: list[str], n: int) -> list[str]:
    """`python -m grpocli.trainer.processes --multi_gpu --num_processes n ... -m grpocli.cli.app train ...`:
    accelerate launch's arguments, run by grpo's launcher (grpocli.trainer.processes)."""
    cmd = [sys.executable, "-m", LAUNCHER, "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", resolved.recipe.train.mixed_precision,
           "--dynamo_backend", "no", "--main_process_port", str(_free_port())]
    recipe = str(resolved.path) if resolved.path else None
    return cmd + ["-m", "grpocli.cli.app", "train", *([recipe] if recipe else []), *overrides]


def _accelerate_launch(resolved: Resolved, overrides: list[str], n: int) -> int:
    """Re-run this same `grpo train` under accelerate with n data-parallel processes."""
    from grpocli.trainer.processes import run_launcher

    return run_launcher(launch_command(resolved, overrides, n), env={**os.environ, LAUNCHED: "1"})


def _free_port() -> int:
    """A TCP port nobody listens on now, so two runs on one machine do not share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- small pieces ----------------------------------------------------------------------------
def _with_train(resolved: Resolved, key: str, value, source: str) -> Resolved:
    recipe = resolved.recipe.model_copy(deep=True)
    setattr(recipe.train, key, value)  # validated on assignment
    return dataclasses.replace(resolved, recipe=recipe, sources={**resolved.sources, f"train.{key}": source})


def _default() -> str:
    from grpocli.recipe.loader import DEFAULT

    return DEFAULT


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
