"""Activation offloading (train.activation_offloading): the tensors a training forward saves for
backward go to host memory as they are saved and come back when backward reads them.

torch's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``), as
``torch.autograd.graph.save_on_cpu`` and torchtune's / TRL's ``OffloadActivations`` use them, with
what those learned kept and their stream overlap left out (copies run on the compute stream, so no
tensor is freed before its copy is done):

* parameters and views of them stay where they are (a linear layer saves its weight; copying it
  would cost a transfer per layer and save nothing), and so do tensors under ``min_bytes``;
* a tensor saved several times in one forward (the normed hidden state that q, k and v projections
  each save) is copied once while it is alive and unchanged;
* a tensor comes back with the strides it was saved with, padding included: the attention mask
  that PyTorch's memory-efficient sdpa pads to aligned rows and saves as a narrowed view must keep
  its row stride, or backward fails with "attn_bias is not correctly aligned (strideM)" (seen on an
  H200 with 30-token rows in float32; torch's own ``save_on_cpu`` had the same bug, pytorch#188246);
* from the output head on (``get_output_embeddings``) nothing is offloaded: the logits and the
  loss's tensors are the first that backward reads, so a round trip would free nothing at its peak.

With gradient checkpointing (model.gradient_checkpointing, non-reentrant) the checkpoint's own
hooks take the saved tensors inside each checkpointed layer (they are recomputed in backward, not
kept), so this offloads what is still saved outside them. On a CPU the copies are made too (to
host memory, where the tensors already are): the same code path, no memory saved.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

#: Tensors smaller than this stay where they are (torchtune's and TRL's min_offload_size).
MIN_OFFLOAD_BYTES = 1024


class ActivationOffloading(saved_tensors_hooks):
    """A context for a training forward: what it saves for backward is copied to host memory (pinned,
    on CUDA) and copied back when backward unpacks it. ``packed`` / ``offloaded_bytes`` count the
    tensors copied (each once) since the context was last entered; ``kept`` those left in place."""

    def __init__(self, model: Any, *, min_bytes: int = MIN_OFFLOAD_BYTES) -> None:
        self.min_bytes = min_bytes
        self.params: set[int] = set()  # storage pointers of the model's parameters, at each __enter__
        self.model = model
        self.paused = False
        self.packed = self.kept = self.offloaded_bytes = 0
        self.copies: dict[tuple, tuple[weakref.ref, tuple[torch.device, torch.Tensor]]] = {}
        self.hook: Any = None
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> ActivationOffloading:
        self.params = _storages(self.model)
        self.paused = False
        self.packed = self.kept = self.offloaded_bytes = 0
        self.copies.clear()
        head = _output_head(self.model)
        if head is not None:  # from the output head on, nothing is offloaded (module docstring)
            self.hook = head.register_forward_pre_hook(self._pause)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        self.copies.clear()  # the copies live on in the autograd graph that holds them

    def _pause(self, *_: Any) -> None:
        self.paused = True

    def _stays(self, t: torch.Tensor) -> bool:
        if self.paused or t.layout != torch.strided or t.numel() * t.element_size() < self.min_bytes:
            return True
        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return True
        try:
            return t.untyped_storage().data_ptr() in self.params
        except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
            return True

    def _pack(self, t: torch.Tensor) -> Any:
        if self._stays(t):
            self.kept += 1
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
               t.device, t._version)
        seen = self.copies.get(key)
        if seen is not None and seen[0]() is not None:  # the same tensor, alive and unchanged: one copy
            return seen[1]
        pin = t.device.type == "cuda"  # t's own strides, there and back (module docstring)
        host = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, pin_memory=pin)
        host.copy_(t, non_blocking=pin)
        packed = (t.device, host)
        self.copies[key] = (weakref.ref(t), packed)
        self.packed += 1
        self.offloaded_bytes += t.numel() * t.element_size()
        return packed

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        if host.device == device:
            return host
        back = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)
        return back.copy_(host, non_blocking=host.is_pinned())


def _storages(model: Any) -> set[int]:
    """Storage pointers of the model's parameters (the local shard of a sharded one)."""
    out = set()
    for p in model.parameters():
        local = getattr(p, "_local_tensor", p)  # FSDP2's DTensor
        try:
            out.add(local.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            continue
    out.discard(0)
    return out


def _output_head(model: Any) -> torch.nn.Module | None:
    """The model's output embeddings (lm_head), through a DDP wrapper or peft."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None
    return head if isinstance(head, torch.nn.Module) else None


__all__ = ["MIN_OFFLOAD_BYTES", "ActivationOffloading"]
