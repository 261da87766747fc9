"""Checkpoints that are complete or absent, and resume that continues exactly.

step-N/ holds the model and tokenizer (save_pretrained, usable by `grpo eval` and vLLM) and
trainer/: optimizer.pt, scheduler.pt, rng-rank{R}.pt, state.json (step, data position, ...).
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

from grpocli.rundir import RunDir


def save_checkpoint(
    run: RunDir, step: int, *, accelerator: Any, model: Any, tokenizer: Any,
    optimizer: Any, scheduler: Any, state: dict[str, Any], keep: int | None,
) -> Path:
    final = run.checkpoint(step)
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "trainer").mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(_rng_state(), tmp / "trainer" / f"rng-rank{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "trainer" / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "trainer" / "scheduler.pt")
        (tmp / "trainer" / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: step-N exists only when complete
        _prune(run, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(
    path: Path, *, accelerator: Any, model: Any, optimizer: Any, scheduler: Any
) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and this process's RNG; return state.json."""
    load_weights(accelerator.unwrap_model(model), path)
    optimizer.load_state_dict(torch.load(path / "trainer" / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "trainer" / "scheduler.pt", weights_only=False))
    rng = path / "trainer" / f"rng-rank{accelerator.process_index}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / "trainer" / "state.json").read_text(encoding="utf-8"))


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


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(run: RunDir, keep: int | None) -> None:
    if keep is None:
        return
    for _, path in run.list_checkpoints()[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
