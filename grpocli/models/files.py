"""A model's files: save_pretrained without a progress bar, and safetensors weights read back
into a live model (a whole model, or a peft adapter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def save_pretrained_quietly(model: Any, path: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """save_pretrained (safetensors) without transformers' "Writing model shards" bar in the output."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, state_dict=state_dict)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a save_pretrained directory's safetensors files."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    return state


def load_weights(model: Any, path: Path) -> None:
    """Load save_pretrained weights (full model or peft adapter) into a live model; a
    RuntimeError naming the tensors when they do not fit it (a tied lm_head may be absent)."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(adapter))
        return
    missing, unexpected = model.load_state_dict(read_weights(path), strict=False)
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")
