"""Failures of the machine rather than of grpo: a full disk, a read-only place, too little memory.

`main` (grpocli.cli.app) turns them into a `UserError` through `as_user_error`, so they are
printed like user errors (what, where, what to do; exit 2) instead of as a traceback. Anything
else (another OSError, a RuntimeError that is not out-of-memory) is left alone: it is a bug to
report with its traceback. Imports nothing heavy: `grpo --help` must not import torch.
"""

from __future__ import annotations

import errno

from grpocli.errors import UserError

#: errno values that mean the disk or the permissions stopped a write (or a read).
FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EFBIG: "the file grew past the size allowed (a file size limit or a full disk)"}
DENIED = {errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
          errno.EPERM: "operation not permitted"}
#: What the knobs that cut memory are, per command.
MEMORY_KNOBS = {
    "train": "train.micro_batch_size (or train.max_tokens_per_micro_batch), generation.max_completion_length, "
             "train.prompts_per_step, generation.num_generations, model.gradient_checkpointing=true, "
             "train.mixed_precision=bf16",
    "eval": "--max-tokens, --n, --num-prompts, generation.backend",
}
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def as_user_error(exc: BaseException, command: str) -> UserError | None:
    """The UserError a disk or memory failure of ``command`` (train, eval, ...) reads as; None
    for anything else."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        return _disk_full(exc, command)
    if isinstance(exc, OSError) and exc.errno in DENIED:
        place = exc.filename or "a file"
        return UserError(
            f"cannot write {place}: {DENIED[exc.errno]} ({exc.strerror})",
            where=_where(command), valid="a directory this user can write in, on a writable file system",
            hint=f"pick another directory ({_where(command)}=...), or check: ls -ld {place}",
        )
    if _is_out_of_memory(exc):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        knobs = MEMORY_KNOBS.get(command, MEMORY_KNOBS["train"])
        return UserError(
            f"out of memory ({type(exc).__name__}: {first[:200]})", where=f"grpo {command}",
            valid=f"smaller batches, sequences or model; the knobs: {knobs}",
            hint="halve the first of them and run the same command again"
            + (" (training resumes from the newest checkpoint)" if command == "train" else ""),
        )
    return None


def _disk_full(exc: OSError, command: str) -> UserError:
    place = exc.filename or "a file"
    again = "; training resumes from the newest checkpoint" if command == "train" else ""
    return UserError(
        f"cannot write {place}: {FULL[exc.errno]} ({exc.strerror})", where=_where(command),
        valid="free space for the run's checkpoints, metrics and rollouts",
        hint=f"free space on that disk (df -h {place}), or a directory on another disk ({_where(command)}=...), "
        f"then run the same command again{again}",
    )


def _is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA and others), or the CPU allocator's RuntimeError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OOM_TEXT)


def _where(command: str) -> str:
    return {"train": "train.output_dir", "eval": "--output-dir", "export": "OUT_DIR"}.get(command, f"grpo {command}")
