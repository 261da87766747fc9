"""LoRA adapters of an FSDP2 policy, written and read as an unsharded run writes and reads them.

A peft model's checkpoint holds its adapters only (adapter_model.safetensors, under peft's names:
`...q_proj.lora_A.weight`, without the adapter name `default`). Under FSDP2 every tensor is a
DTensor shard, and peft's own `set_peft_model_state_dict` loads plain tensors into them (which
torch refuses), so grpo maps peft's names to the model's state-dict names itself: the checkpoint
gathers those tensors only (one at a time, never the base weights), and resume hands each process
the whole adapter tensors, of which it keeps its shard.
"""

from __future__ import annotations

from typing import Any

import torch

from grpocli.parallel.fsdp2 import full_tensor, load_full_state


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


def full_adapter_state(model: Any, keep: bool) -> dict[str, torch.Tensor]:
    """The adapter tensors, whole, on the CPU, under the model's state-dict names (what peft's
    `save_pretrained(state_dict=...)` takes); every process calls it (each gather is a collective),
    the ones with `keep` False get {}."""
    state = model.state_dict()
    chosen = set(adapter_names(model).values())
    chosen_ids = {id(state[name]) for name in chosen}
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor | None] = {}  # tied tensors (a saved embedding and lm_head): gathered once
    for name, tensor in state.items():  # every name of a chosen tensor: peft picks among them itself
        if id(tensor) not in chosen_ids:
            continue
        if id(tensor) not in seen:
            seen[id(tensor)] = full_tensor(tensor.detach(), keep)
        if keep:
            out[name] = seen[id(tensor)]
    return out


def load_full_adapter_state(model: Any, saved: dict[str, torch.Tensor]) -> None:
    """Load an adapter checkpoint's tensors (peft's names, whole; every process read them) into a
    sharded peft model; a RuntimeError when they are not this model's adapters."""
    names = adapter_names(model)
    missing = sorted(set(names) - set(saved))
    unexpected = sorted(set(saved) - set(names))
    if missing or unexpected:
        raise RuntimeError(f"the adapter checkpoint does not fit the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    load_full_state(model, {names[name]: tensor for name, tensor in saved.items()})


__all__ = ["adapter_names", "full_adapter_state", "is_peft", "load_full_adapter_state"]
