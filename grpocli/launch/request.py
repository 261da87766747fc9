"""What the `accelerate launch` that started this process was asked for, and the mixed precision
the run uses.

The command line is read from the parent process (/proc on Linux) with accelerate's own parser,
and its config file with accelerate's own reader: how many processes and machines, and where its
mixed precision came from.

Mixed precision under `accelerate launch`: accelerate hands its choice (its --mixed_precision,
else its config file, else "no") to the processes as ACCELERATE_MIXED_PRECISION. Where it and the
recipe's `train.mixed_precision` differ, the one that was set explicitly is used: accelerate's
when it asks for bf16/fp16 or was given --mixed_precision, the recipe's when a recipe file,
GRPO_TRAIN__MIXED_PRECISION or an argument set it. Both set and different: exit 2, naming both.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from grpocli.errors import UserError
from grpocli.launch.processes import LAUNCHER
from grpocli.recipe import Resolved

#: Set by every `accelerate launch` launcher in the processes it starts.
ACCELERATE_PRECISION = "ACCELERATE_MIXED_PRECISION"


def started_by_accelerate() -> bool:
    return ACCELERATE_PRECISION in os.environ


@dataclasses.dataclass(frozen=True)
class AccelerateRequest:
    """What the `accelerate launch` that started this process was asked for (its command line)."""

    num_processes: int | None    # None: neither --num_processes nor its config file says
    num_machines: int            # --num_machines, else its config file's, else 1
    mixed_precision_from: str    # where accelerate's mixed precision came from, in words
    mixed_precision_flag: bool   # --mixed_precision was given on its command line


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
    theirs_set, ours_set = theirs != "no" or flag, ours_from != default_source()
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
    return with_train(resolved, "mixed_precision", theirs, where)


# -- the accelerate launch that started this process ----------------------------------------
def accelerate_request(argv: list[str] | None = None) -> AccelerateRequest | None:
    """Read the parent `accelerate launch` command line (Linux /proc); None where it cannot be."""
    if argv is None:
        if not started_by_accelerate():
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
        before = Path(argv[i - 1]).name if i > 0 else ""
        if part == "launch" and before in ("accelerate", "accelerate.commands.accelerate_cli"):
            return argv[i + 1 :]
    return None


def with_train(resolved: Resolved, key: str, value, source: str) -> Resolved:
    recipe = resolved.recipe.model_copy(deep=True)
    setattr(recipe.train, key, value)  # validated on assignment
    return dataclasses.replace(resolved, recipe=recipe, sources={**resolved.sources, f"train.{key}": source})


def default_source() -> str:
    from grpocli.recipe.loader import DEFAULT

    return DEFAULT
