"""A LoRA policy's adapters: which tensors they are, under peft's checkpoint names and the model's.

A peft model's checkpoint holds its adapters only (adapter_model.safetensors, under peft's names:
`...q_proj.lora_A.weight`, without the adapter name `default`). Under FSDP2 every tensor is a
DTensor shard, and peft's own `set_peft_model_state_dict` loads plain tensors into them (which
torch refuses), so grpo maps peft's names to the model's state-dict names itself (`adapter_names`):
the FSDP2 checkpoint gathers those tensors only (one at a time, never the base weights), and
resume hands each process the whole adapter tensors, of which it keeps its shard
(grpocli.parallel.fsdp2: `full_adapter_state`, `load_full_adapter_state`).
"""

from __future__ import annotations

from typing import Any


def is_peft(model: Any) -> bool:
    """Whether `model` is a peft model (one that saves adapters, not full weights)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_names(model: Any) -> dict[str, str]:
    """peft's checkpoint name -> the model's state-dict name, for every tensor an adapter
    checkpoint of `model` holds (peft's own choice: `get_peft_model_state_dict`, which only
    selects and renames; nothing is gathered here)."""
    from peft import get_peft_model_state_dict

    state = model.state_dict()
    name_of = {id(tensor): name for name, tensor in state.items()}
    saved = get_peft_model_state_dict(model, state_dict=state)
    unknown = [name for name, tensor in saved.items() if id(tensor) not in name_of]
    if unknown:  # peft built a tensor of its own: grpo cannot tell which shard it comes from
        raise RuntimeError(f"peft's adapter state holds tensors that are not the model's: {unknown[:3]}")
    return {name: name_of[id(tensor)] for name, tensor in saved.items()}


__all__ = ["adapter_names", "is_peft"]
