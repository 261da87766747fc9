"""Checkpoints that are complete or absent, and resume that continues exactly.

step-N/ holds the model and tokenizer (save_pretrained, usable by `grpo eval` and vLLM) and
trainer/: optimizer.pt, scheduler.pt, rng-rank{R}.pt, state.json (step, data position, ...) and,
when the reference model moves (ref_sync_steps > 0), reference.safetensors.
It is written as step-N.tmp and renamed when every process has finished writing.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpocli.errors import UserError
from grpocli.rundir import RunDir

#: The moving reference model (algorithm.ref_sync_steps > 0), inside step-N/trainer/.
REFERENCE = "reference.safetensors"


def save_checkpoint(
    run: RunDir, step: int, *, accelerator: Any, model: Any, tokenizer: Any,
    optimizer: Any, scheduler: Any, state: dict[str, Any], keep: int | None, reference: Any = None,
) -> Path:
    """Write step-N.tmp on every process, then rename it to step-N (main process).

    `reference` is saved too when given (a reference model that moves: ref_sync_steps > 0).
    """
    _check_replicas(accelerator, model)
    final = run.checkpoint(step)
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        for stale in run.checkpoints.glob("step-*.tmp"):  # left by a crash: never complete
            shutil.rmtree(stale, ignore_errors=True)
        (tmp / "trainer").mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(_rng_state(), tmp / "trainer" / f"rng-rank{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        _save_model(accelerator.unwrap_model(model), tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "trainer" / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "trainer" / "scheduler.pt")
        if reference is not None:
            from safetensors.torch import save_model

            save_model(reference, str(tmp / "trainer" / REFERENCE))
        (tmp / "trainer" / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: step-N exists only when complete
        _fsync_dir(final.parent)
        _prune(run, keep)
    accelerator.wait_for_everyone()
    return final


def resume_point(run: RunDir, resume: str, steps: int) -> tuple[int, Path] | None:
    """The checkpoint `train.resume` names (step, path), None to start afresh; UserError for a
    directory that already holds a run it may not continue, or a complete one."""
    if resume not in ("auto", "never"):
        path = Path(resume)
        if not (path / "trainer" / "state.json").exists():
            raise UserError(f"no checkpoint at {resume}", where="train.resume",
                            valid=", ".join(str(p) for _, p in run.list_checkpoints()) or "'auto' or 'never'",
                            hint=f"ls {run.checkpoints}")
        return int(path.name.rsplit("-", 1)[-1]), path
    latest = run.latest_checkpoint()
    if run.has_run() and resume == "never":
        raise UserError(
            f"the run directory {run.root} already holds a run", where="train.output_dir",
            valid="an empty or new directory", hint="pick another: train.output_dir=runs/new, or resume: train.resume=auto",
        )
    if latest is not None and latest[0] >= steps:
        raise UserError(
            f"the run in {run.root} is already complete (checkpoint step-{latest[0]}, train.steps = {steps})",
            where="train.output_dir", valid=f"train.steps > {latest[0]} to train on, or a new output_dir",
            hint=f"grpo inspect {run.root}   or   grpo train ... train.output_dir=runs/new",
        )
    return latest


def load_checkpoint(
    path: Path, *, accelerator: Any, model: Any, optimizer: Any, scheduler: Any, reference: Any = None,
) -> dict[str, Any]:
    """Restore weights, optimizer, learning rate, this process's RNG (and a saved reference); return state.json.

    The learning rate follows the schedule of the recipe being resumed (the scheduler is stepped to
    the checkpoint's step), so a run extended with a larger train.steps decays over the new length.
    Call it after every seeding: the RNG state it restores is the one the saved run had at step N.
    """
    state = json.loads((path / "trainer" / "state.json").read_text(encoding="utf-8"))
    load_weights(accelerator.unwrap_model(model), path)
    optimizer.load_state_dict(torch.load(path / "trainer" / "optimizer.pt", weights_only=False))
    _fast_forward(scheduler, state["step"])
    saved_reference = path / "trainer" / REFERENCE
    if reference is not None and saved_reference.exists():
        from safetensors.torch import load_model

        load_model(reference, str(saved_reference))
    rng = path / "trainer" / f"rng-rank{accelerator.process_index}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state


def load_weights(model: Any, path: Path) -> None:
    """Load save_pretrained weights (full model or peft adapter) into a live model."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(adapter))
        return
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")


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


def _save_model(model: Any, path: Path) -> None:
    """save_pretrained without transformers' "Writing model shards" bar in the training output."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)  # safetensors is the default
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _fast_forward(scheduler: Any, step: int) -> None:
    """Step a fresh scheduler to `step`: the learning rate of the current schedule at that step."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(step - scheduler.last_epoch):
            scheduler.step()


def _check_replicas(accelerator: Any, model: Any) -> None:
    """DDP replicas must hold the same weights; a cheap fingerprint checks it (sharded FSDP or
    DeepSpeed parameters differ per process by design and are not checked)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return
    with torch.no_grad():
        mine = torch.stack([p.detach().double().sum() for p in model.parameters()])  # [P]
    every = accelerator.gather(mine.to(accelerator.device)[None]).cpu()          # [W, P]
    if not torch.allclose(every, every[0].expand_as(every), rtol=1e-6, atol=1e-9):
        raise RuntimeError(f"the {accelerator.num_processes} processes hold different weights: "
                           f"parameter sums {every.sum(dim=1).tolist()}")


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
