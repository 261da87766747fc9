"""FSDP2: the policy (and an in-process reference) split over the training processes.

`train.sharding = "fsdp2"`, or an `accelerate launch --config_file` with FSDP version 2, shards
with torch's `fully_shard` (the API under accelerate's FSDP2 plugin): every decoder layer is a
unit of its own (the model's `_no_split_modules`, accelerate's transformer_based_wrap), the root
holds the rest (embeddings, a tied lm_head, the final norm). grpo applies `fully_shard` itself on
every device, because accelerate applies its FSDP plugin to GPUs only (on CPU it stays DDP); a
GPU launch whose accelerate config already selects FSDP2 is sharded by accelerate.

What sharding changes, as `Fsdp2` answers it (grpocli.parallel.strategy.Parallel):

* Every forward gathers each unit's parameters (a collective), so every process runs the same
  number of forward and backward passes (`forward_passes`, `backward_passes`: padded with None,
  each None a 1-token `idle_forward`), and a loop of generate calls goes on while any process
  has work (`any_process`). HF generation keeps the processes together by transformers'
  `synced_gpus`, which it turns on for a module marked `_is_fsdp_managed_module` (set here).
* Full weights exist only while gathered: checkpoints and weight syncs gather one tensor at a
  time (`full_tensor`); the main process keeps what it writes or sends (on the CPU). A LoRA
  policy's checkpoint gathers its adapters only (named by grpocli.parallel.adapters).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from grpocli.errors import UserError
from grpocli.parallel.adapters import adapter_names, is_peft
from grpocli.parallel.strategy import REFERENCE, Parallel, keep_logits_dtype, load_reference

FSDP2 = "fsdp2"


class Fsdp2(Parallel):
    """FSDP2 over every process (module docstring)."""

    forward_collective = True
    backward_collective = True
    sharding = FSDP2

    def __init__(self, accelerator: Any, mixed_precision: str = "no") -> None:
        super().__init__(accelerator)
        self.mixed_precision = mixed_precision

    def whole_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.full_tensor() if is_shard(tensor) else tensor

    def local_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if is_shard(tensor) else tensor

    def shard_like(self, whole: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        if not is_shard(held):
            return whole
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank None: each process cuts its own shard out of its whole copy, nothing is sent
        return distribute_tensor(whole.to(held.device), held.device_mesh, held.placements, src_data_rank=None)

    def prepare(self, model: Any, reference: Any, optimizer: Callable[[Any], tuple[Any, Any]]) -> tuple[Any, ...]:
        acc = self.accelerator
        if acc.is_fsdp2:  # accelerate's FSDP2 plugin (a GPU launch whose config selects it)
            opt, scheduler = optimizer(model)
            model, opt = acc.prepare(model, opt)
            keep_logits_dtype(self.unwrap(model), acc)
            mark(model)
        else:  # grpo shards: accelerate applies FSDP on GPUs only, and only from its config
            model = shard(model, acc, self.mixed_precision)
            opt, scheduler = optimizer(model)  # over the shards
            opt = acc.prepare(opt)
        if isinstance(reference, torch.nn.Module):  # not a grpo ref-serve client: that holds no weights here
            reference = shard(reference, acc, self.mixed_precision)
        return model, reference, opt, scheduler

    # -- checkpoints: the same files as unsharded, gathered a tensor at a time ---------------
    def save_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        from grpocli.models.files import save_pretrained_quietly

        model, main = self.unwrap(model), self.main
        weights = full_adapter_state(model, keep=main) if is_peft(model) else full_state(model, keep=main)
        if main:
            save_pretrained_quietly(model, folder, state_dict=weights)
        del weights
        optim = full_optimizer_state(model, optimizer)
        if main:
            torch.save(optim, folder / "trainer" / "optimizer.pt")
        del optim
        if reference is not None:
            ref = full_state(reference, keep=main)
            if main:
                from safetensors.torch import save_file

                save_file(untied(ref), str(folder / "trainer" / REFERENCE))

    def load_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        """Every process reads the whole files and keeps its shard."""
        from grpocli.models.files import read_weights

        model = self.unwrap(model)
        optim = torch.load(folder / "trainer" / "optimizer.pt", map_location="cpu", weights_only=False)
        if is_peft(model):  # a LoRA checkpoint: the adapters (a missing file is an OSError)
            from safetensors.torch import load_file

            load_full_adapter_state(model, load_file(folder / "adapter_model.safetensors"))
        else:
            load_full_state(model, read_weights(folder))
        load_full_optimizer_state(model, optimizer, optim)
        load_reference(folder, reference, load_sharded=load_full_state)


def sharding_of(sharding: str, accelerator: Any) -> str:
    """'fsdp2' when `train.sharding` or accelerate's launch asks for it, else 'none'; a
    UserError for FSDP version 1 (accelerate config) or FSDP2 together with DeepSpeed."""
    asked = sharding
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


# -- full tensors, one at a time -----------------------------------------------------------
def is_shard(tensor: torch.Tensor) -> bool:
    """Whether a state-dict tensor is a DTensor shard (the parameters; buffers stay plain)."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor, keep: bool = True) -> torch.Tensor | None:
    """The whole of a DTensor shard (a collective: every process calls it), moved to the CPU;
    None where `keep` is False (a process that only takes part). Plain tensors come back as they are."""
    if not is_shard(tensor):
        return tensor
    whole = tensor.full_tensor()
    return whole.cpu() if keep else None


def full_state(model: Any, keep: bool) -> dict[str, torch.Tensor]:
    """The model's state dict as whole CPU tensors, gathered one tensor at a time; every process
    calls it, the ones with `keep` False get {} (no process holds two whole copies)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}  # tied tensors (lm_head = embed_tokens): gathered once, shared
    for name, tensor in model.state_dict().items():
        local = tensor.to_local() if is_shard(tensor) else tensor
        key = local.untyped_storage().data_ptr() + local.storage_offset() * local.element_size()
        if key not in seen:
            seen[key] = full_tensor(tensor.detach(), keep)
        if keep:
            out[name] = seen[key]
    return out


def untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tied tensors once (lm_head = embed_tokens): safetensors refuses shared or repeated storage."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in state.items():
        if t.data_ptr() not in seen:
            seen[t.data_ptr()] = name
            out[name] = t.contiguous()
    return out


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, whole, keyed by parameter names (torch.distributed.checkpoint's
    full state dict); every process calls it, the main one gets the state on the CPU."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(model, _inner(optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load whole tensors (every process read them) into a sharded model: each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(model, _inner(optimizer), state, options=StateDictOptions(full_state_dict=True))


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


def _inner(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's AcceleratedOptimizer."""
    return getattr(optimizer, "optimizer", optimizer)


__all__ = ["FSDP2", "Fsdp2", "full_adapter_state", "full_optimizer_state", "full_state", "full_tensor",
           "load_full_adapter_state", "load_full_optimizer_state", "load_full_state", "mark", "shard", "sharding_of",
           "untied"]
