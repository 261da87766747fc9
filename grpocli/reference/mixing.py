"""TRL's SyncRefModelCallback mix, ``ref = alpha * policy + (1 - alpha) * ref``, over each tensor once.

A tied lm_head (the same tensor as embed_tokens) is mixed once, as TRL's loop over
``parameters()`` does; walking ``state_dict()`` naively mixes it twice (for alpha < 1 that gives
``ref = alpha * (2 - alpha) * policy + (1 - alpha)**2 * ref``). The in-process refresh
(`refresh_reference`, which the training loop calls) and `grpo ref-serve` (grpocli.reference.host)
both call ``mix_tensor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grpocli.generation.weights import PolicyWeights, policy_weights
from grpocli.parallel import Parallel
from grpocli.reference.client import ReferenceClient


def reference_tensors(model: Any) -> PolicyWeights:
    """A (plain, unsharded) model's tensors under checkpoint names; ``unique()`` walks each storage
    once and ``aliases`` names the tied ones (lm_head -> embed_tokens), as a checkpoint holds them."""
    return PolicyWeights(model, peft=False, dtype=None, parallel=Parallel.alone())


@torch.no_grad()
def mix_tensor(target: torch.Tensor, policy: torch.Tensor, alpha: float) -> None:
    """``target = alpha * policy + (1 - alpha) * target`` in place, in the target's dtype."""
    if tuple(target.shape) != tuple(policy.shape):
        raise ValueError(f"shape {list(policy.shape)} does not fit the reference's {list(target.shape)}")
    target.mul_(1 - alpha).add_(policy.to(device=target.device, dtype=target.dtype), alpha=alpha)


@torch.no_grad()
def mix_state(reference: Any, policy: Mapping[str, torch.Tensor], alpha: float) -> None:
    """Mix ``policy`` (a state dict under the reference's names, or `PolicyWeights.state()`, which
    computes a LoRA sum as it is looked up) into a live reference model, each tensor once, looked up
    in the reference's state-dict order: tied ones are the same object in ``state_dict(keep_vars=True)``
    (sharded or not)."""
    seen: set[int] = set()
    for name, tensor in reference.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        mix_tensor(tensor, policy[name], alpha)


def refresh_reference(reference: Any, policy: Any, parallel: Parallel, alpha: float) -> None:
    """ref = alpha * policy + (1 - alpha) * ref, each tensor once (a tied lm_head too); with a
    reference server (a ReferenceClient), the server mixes what is sent."""
    if isinstance(reference, ReferenceClient):  # the server mixes: the trainer holds no reference weights
        reference.refresh(policy, alpha)
        return
    with policy_weights(policy, parallel=parallel) as weights:  # LoRA: adapters added (each sum computed
        mix_state(reference, weights.state(), alpha)            # as the mix reaches it); FSDP2: shards


__all__ = ["mix_state", "mix_tensor", "reference_tensors", "refresh_reference"]
