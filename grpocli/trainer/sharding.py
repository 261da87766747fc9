"""FSDP2: the policy (and an in-process reference) split over the training processes.

`train.sharding = "fsdp2"`, or an `accelerate launch --config_file` with FSDP version 2, shards
with torch's `fully_shard` (the API under accelerate's FSDP2 plugin): every decoder layer is a
unit of its own (the model's `_no_split_modules`, accelerate's transformer_based_wrap), the root
holds the rest (embeddings, a tied lm_head, the final norm). grpo applies `fully_shard` itself on
every device, because accelerate applies its FSDP plugin to GPUs only (on CPU it stays DDP); a
GPU launch whose accelerate config already selects FSDP2 is sharded by accelerate.

What sharding changes for the loop:

* Every forward gathers each unit's parameters (a collective), so every process must run the
  same number of forward passes. `even_passes` pads a process's list of micro-batches with None
  up to the most any process has; each None is `idle_forward` (a 1-token pass, loss 0). HF
  generation keeps the processes together by transformers' `synced_gpus`, which it turns on for
  a module marked `_is_fsdp_managed_module` (set here).
* Full weights exist only while gathered: checkpoints and weight syncs gather one tensor at a
  time (`full_tensors`); the main process keeps what it writes or sends (on the CPU).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from grpocli.errors import UserError

FSDP2 = "fsdp2"


def is_sharded(model: Any) -> bool:
    """Whether `model` is an FSDP2 module (its parameters are DTensor shards)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def sharding_of(recipe: Any, accelerator: Any) -> str:
    """'fsdp2' when the recipe or accelerate's launch asks for it, else 'none'; a UserError for
    FSDP version 1 (accelerate config) or combinations grpo cannot shard."""
    asked = recipe.train.sharding
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        version = os.environ.get("FSDP_VERSION", "1")
        if version != "2":
            raise UserError(
                f"accelerate's config asks for FSDP version {version}; grpo shards with FSDP2 only",
                where="accelerate config (fsdp_config.fsdp_version)", valid="fsdp_version: 2",
                hint="set fsdp_version: 2 in the accelerate config (configs/fsdp2.yaml), or train.sharding=fsdp2",
            )
        asked = FSDP2
    if getattr(accelerator, "is_fsdp2", False):
        asked = FSDP2
    if asked == FSDP2 and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise UserError("train.sharding = 'fsdp2' and accelerate's DeepSpeed config both shard the model",
                        where="train.sharding", valid="one of them",
                        hint="drop train.sharding (DeepSpeed ZeRO shards), or launch without the DeepSpeed config")
    return asked


def mixed_precision_policy(mixed_precision: str) -> Any:
    """FSDP2's own mixed precision: parameters gathered in bf16/fp16, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)


def shard(model: Any, accelerator: Any, mixed_precision: str = "no") -> Any:
    """`fully_shard` every decoder layer, then the root, over all processes; returns the model
    (the same object, now an FSDPModule) on the accelerator's device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = accelerator.device
    mesh = init_device_mesh(device.type, (accelerator.num_processes,))
    model.to(device)
    kwargs = {"mesh": mesh, "mp_policy": mixed_precision_policy(mixed_precision)}
    for layer in _layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    mark(model)
    return model


def mark(model: Any) -> None:
    """Tell transformers' generate to keep the processes in step (synced_gpus)."""
    model._is_fsdp_managed_module = True


def _layers(model: Any) -> list[Any]:
    """The modules accelerate's transformer_based_wrap would wrap: the classes in _no_split_modules."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


# -- every process the same number of forward passes ---------------------------------------
def even_passes(model: Any, items: list[Any]) -> list[Any]:
    """`items` padded with None to the most any process has, when `model` is sharded (else as given)."""
    if not is_sharded(model):
        return items
    import torch.distributed as dist

    count = torch.tensor([len(items)], dtype=torch.int64, device=_device(model))
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return list(items) + [None] * (int(count) - len(items))


def idle_forward(model: Any) -> torch.Tensor:
    """A forward pass over one token whose loss is 0: the gathers (and, after backward, the
    gradient reductions) of a pass, with no effect on the gradients."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=_device(model))
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    return logits.sum() * 0.0


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


# -- full tensors, one at a time -----------------------------------------------------------
def full_tensor(tensor: torch.Tensor, keep: bool = True) -> torch.Tensor | None:
    """The whole of a DTensor shard (a collective: every process calls it), moved to the CPU;
    None where `keep` is False (a process that only takes part). Plain tensors come back as they are."""
    if not hasattr(tensor, "full_tensor"):
        return tensor
    whole = tensor.full_tensor()
    return whole.cpu() if keep else None


def full_state(model: Any, keep: bool) -> dict[str, torch.Tensor]:
    """The model's state dict as whole CPU tensors, gathered one tensor at a time; every process
    calls it, the ones with `keep` False get {} (no process holds two whole copies)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}  # tied tensors (lm_head = embed_tokens): gathered once, shared
    for name, tensor in model.state_dict().items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        key = local.untyped_storage().data_ptr() + local.storage_offset() * local.element_size()
        if key not in seen:
            seen[key] = full_tensor(tensor.detach(), keep)
        if keep:
            out[name] = seen[key]
    return out


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, whole, keyed by parameter names (torch.distributed.checkpoint's
    full state dict); every process calls it, the main one gets the state on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, _inner(optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load whole tensors (every process read them) into a sharded model: each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, _inner(optimizer), state, options=StateDictOptions(full_state_dict=True))


def _inner(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's AcceleratedOptimizer."""
    return getattr(optimizer, "optimizer", optimizer)


__all__ = ["FSDP2", "even_passes", "full_optimizer_state", "full_state", "full_tensor", "idle_forward",
           "is_sharded", "load_full_optimizer_state", "load_full_state", "mark", "shard", "sharding_of"]


# -- loops that generate: every process as many rounds --------------------------------------
def any_process(model: Any, flag: bool) -> bool:
    """Whether `flag` holds on any process (one all_reduce) when `model` is sharded, else `flag`:
    a loop of generate calls (the turns of multi-turn rollouts) goes on while any process still
    has work, because each call is a collective under FSDP2."""
    if not is_sharded(model):
        return flag
    import torch.distributed as dist

    value = torch.tensor([int(flag)], dtype=torch.int64, device=_device(model))
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
