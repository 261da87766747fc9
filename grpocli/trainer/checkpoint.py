"""Checkpoints that are complete or absent, and resume that continues exactly.

step-N/ holds the model and tokenizer (save_pretrained, usable by `grpo eval` and vLLM) and
trainer/: optimizer.pt, scheduler.pt, rng-rank{R}.pt, state.json (step, data position, ...) and,
when the reference model moves (ref_sync_steps > 0), reference.safetensors.
It is written as step-N.tmp and renamed when every process has finished writing.

The weights and the optimizer state are written and read by the parallel strategy
(grpocli.parallel: `save_weights`, `load_weights`), the same files whatever it is: under FSDP2
gathered one tensor at a time and written whole by the main process (a checkpoint loads under any
number of processes); under DeepSpeed ZeRO-2/3 the model whole plus DeepSpeed's own partitions in
trainer/deepspeed/ (resume is exact with the same number of processes and stage).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpocli.errors import UserError
from grpocli.parallel import Parallel
from grpocli.recipe.resume import SAVED_RECIPE
from grpocli.rundir import RunDir, free_space, is_write_failure, megabytes, write_error


def save_checkpoint(
    run: RunDir, step: int, *, parallel: Parallel, model: Any, tokenizer: Any,
    optimizer: Any, scheduler: Any, state: dict[str, Any], keep: int | None, reference: Any = None,
) -> Path:
    """Write step-N.tmp on every process, then rename it to step-N (main process).

    `reference` is saved too when given (a reference model that moves: ref_sync_steps > 0).
    A write that fails (a full disk, a quota) removes step-N.tmp and raises a UserError saying
    how much space a checkpoint takes; the earlier checkpoints and metrics.jsonl stay as they were.
    """
    parallel.check_replicas(model)
    final = run.checkpoint(step)
    tmp = final.with_name(final.name + ".tmp")
    try:
        _write(run, tmp, parallel=parallel, model=model, tokenizer=tokenizer, optimizer=optimizer,
               scheduler=scheduler, state=state, reference=reference)
    except BaseException as err:  # a full disk, a bug, or a signal (grpocli.trainer.signals): never complete
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, Exception) and is_write_failure(err):
            raise _write_failed(run, step, tmp, err, model) from None
        raise
    if parallel.main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: step-N exists only when complete
        _fsync_dir(final.parent)
        _prune(run, keep)
    parallel.wait()
    return final


def _write(run: RunDir, tmp: Path, *, parallel: Parallel, model: Any, tokenizer: Any, optimizer: Any,
           scheduler: Any, state: dict[str, Any], reference: Any) -> None:
    """Every file of step-N.tmp, flushed to disk (each process its RNG state, the strategy the
    weights and optimizer state, the main process the rest)."""
    if parallel.main:
        for stale in run.checkpoints.glob("step-*.tmp"):  # left by a crash: never complete
            shutil.rmtree(stale, ignore_errors=True)
        (tmp / "trainer").mkdir(parents=True)
    parallel.wait()
    torch.save(_rng_state(), tmp / "trainer" / f"rng-rank{parallel.rank}.pt")
    parallel.save_weights(tmp, model=model, optimizer=optimizer, reference=reference)
    if parallel.main:
        tokenizer.save_pretrained(tmp)
        torch.save(scheduler.state_dict(), tmp / "trainer" / "scheduler.pt")
        (tmp / "trainer" / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        if run.config.is_file():  # the recipe these weights were trained with: a resume compares against it
            shutil.copyfile(run.config, tmp / SAVED_RECIPE)
    parallel.wait()
    if parallel.main:
        _fsync_tree(tmp)


def load_checkpoint(
    path: Path, *, parallel: Parallel, model: Any, optimizer: Any, scheduler: Any, reference: Any = None,
    lr_scale: float | None = None,
) -> dict[str, Any]:
    """Restore weights, optimizer, learning rate, this process's RNG (and a saved reference); return state.json.

    The learning rate follows the schedule of the recipe being resumed (the scheduler is stepped to
    the checkpoint's step), so a run extended with a larger train.steps decays over the new length;
    times `lr_scale` (None: the checkpoint's own, which train.guard's rollbacks lower).
    Call it after every seeding: the RNG state it restores is the one the saved run had at step N.
    A file that cannot be loaded (damage past its header, a model of another shape) is a UserError.
    """
    try:
        state = json.loads((path / "trainer" / "state.json").read_text(encoding="utf-8"))
        parallel.load_weights(path, model=model, optimizer=optimizer, reference=reference)
        _fast_forward(scheduler, state["step"], state.get("lr_scale", 1.0) if lr_scale is None else lr_scale)
        _load_rng(path, parallel.rank)
        return state
    except (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"cannot resume from {path}: {first}", where="train.resume",
            valid="a checkpoint of this recipe's model, written by grpo train",
            hint=f"train.resume=PATH of an older checkpoint (ls {path.parent}), or a new train.output_dir",
        ) from None


def _load_rng(path: Path, rank: int) -> None:
    """This process's saved random state; one saved by fewer processes leaves the others at their seed."""
    rng = path / "trainer" / f"rng-rank{rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, map_location="cpu", weights_only=False))
    else:  # saved by fewer processes than resume it: this one starts from its seed
        _warn(f"{rng} is missing (the run had fewer processes): process {rank} "
              "continues from its seed, not the saved random state", everywhere=True)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fast_forward(scheduler: Any, step: int, lr_scale: float = 1.0) -> None:
    """Step the scheduler from its start to `step`: the learning rate of the current schedule at that step,
    times `lr_scale` from then on (a scheduler that has stepped past it, as in a rollback, starts again)."""
    import warnings

    scheduler.base_lrs = [group["initial_lr"] * lr_scale for group in scheduler.optimizer.param_groups]
    scheduler.last_epoch = -1  # as made: its first step sets the learning rate of step 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(step + 1):
            scheduler.step()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(run: RunDir, keep: int | None) -> None:
    if keep is None:
        return
    for _, path in run.list_checkpoints()[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


# -- failures ----------------------------------------------------------------------------------
def _write_failed(run: RunDir, step: int, tmp: Path, err: BaseException, model: Any) -> UserError:
    """A UserError for a checkpoint that could not be written: the error, the space one takes
    (the newest complete one's size, else the weights plus AdamW's two moments) and the space free."""
    latest = run.latest_checkpoint()
    if latest is not None:
        needed = sum(f.stat().st_size for f in latest[1].rglob("*") if f.is_file())
        size = f"about {megabytes(needed)} (the size of {latest[1].name})"
    else:
        needed = sum(p.numel() * p.element_size() for p in model.parameters()) + 2 * sum(
            p.numel() * 4 for p in model.parameters() if p.requires_grad)
        size = f"about {megabytes(needed)} (weights and optimizer state)"
    free, first = free_space(run.checkpoints, needed), write_error(err)
    resume = f"it resumes from {latest[1].name}" if latest is not None else "it starts again from step 0"
    return UserError(
        f"could not write the checkpoint of step {step} to {tmp}: {first}; a checkpoint needs {size}, "
        f"{free}; the earlier checkpoints and metrics.jsonl are as they were",
        where="train.output_dir",
        valid=f"a disk with {size.split(' (')[0]} free per checkpoint kept (train.save_total_limit)",
        hint=f"free space in {run.root.parent} (or set train.save_total_limit=2, or a train.output_dir on a "
        f"larger disk), then run the same command again: {resume}",
    )


def _warn(text: str, *, everywhere: bool = False) -> None:
    """A warning on stderr, from the first process only unless ``everywhere``."""
    if everywhere or os.environ.get("RANK", "0") == "0":
        print(f"warning: {text}", file=sys.stderr, flush=True)
