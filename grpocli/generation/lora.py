"""LoRA adapters added to their base weights out of place, for a weight sync.

peft's ``merge_adapter`` / ``unmerge_adapter`` (what TRL's ``_move_model_to_vllm`` calls) writes
``W + d`` into the frozen base weight and subtracts ``d`` again after the sync. In bfloat16 each
round trip rounds ``W``, so the base drifts a little with every sync, and no checkpoint holds the
drift (a peft checkpoint holds the adapters only): the exported model is not the one that trained.
Here nothing writes into the model. When the sync reaches a base weight that carries an adapter,
`LoraTerm.merged` computes ``W + scaling * (B @ A)`` (transposed for ``fan_in_fan_out``) into a
new tensor, from ``W``, ``A`` and ``B`` made whole by the parallel strategy (under FSDP2 each is a
gather of its own, in that order on every process).

Covered (`lora_terms`): peft LoRA ``Linear`` layers (``nn.Linear``, and GPT-2's ``Conv1D`` with
``fan_in_fan_out``) with one active adapter, plain LoRA (no DoRA or other variant, no
``lora_bias``), adapters neither merged nor disabled, the base weight no other module's (not
tied). Any other tuner layer in the model (DoRA, embedding or conv LoRA, several active adapters,
other peft tuners such as IA3, AdaLoRA or trainable tokens) raises `Uncovered`, and
`grpocli.generation.weights.policy_weights` falls back to peft's merge/unmerge for the whole
model, with a warning that names the layer (the base weights then round a little each sync, as
before).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: Makes a state-dict tensor whole (`Parallel.whole_tensor`: FSDP2 gathers a shard).
Whole = Callable[[torch.Tensor], torch.Tensor]


class Uncovered(ValueError):
    """A peft model whose adapters `LoraTerm` cannot add out of place; the message names the layer."""


@dataclass(frozen=True)
class LoraTerm:
    """The adapter of one LoRA Linear layer: its base weight ``W`` is sent as ``W + scaling * (B @ A)``."""

    a: torch.Tensor  # [r, in_features] lora_A's weight, as the model holds it (FSDP2: a DTensor shard)
    b: torch.Tensor  # [out_features, r] lora_B's weight, likewise
    scaling: float  # lora_alpha / r (peft's scaling for the active adapter)
    fan_in_fan_out: bool  # W is [in_features, out_features] (GPT-2's Conv1D): the product is transposed

    def whole(self, whole: Whole) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B) whole: A first, then B (under FSDP2 a gather each; every process in this order)."""
        return whole(self.a.detach()), whole(self.b.detach())

    def merged(self, weight: torch.Tensor, dtype: torch.dtype, whole: Whole) -> torch.Tensor:
        """``weight + scaling * (B @ A)`` as a new tensor of ``dtype``; ``weight`` (whole) is only read.

        Computed in float32 (or ``weight``'s dtype where that is wider) and cast to ``dtype`` once,
        so the sent weight is the float32 sum rounded once: as close as ``dtype`` gets to what the
        training forward computes (``base(x) + scaling * B(A(x))``, where ``W`` and the product are
        never added and rounded together). peft's merge rounds the product to the adapters' dtype
        first, then the sum to ``W``'s dtype (then a second cast to an engine's dtype). With float32
        adapters (peft's default for a bf16 base) the two differ by at most one unit in the last
        place of ``dtype``; with bf16 adapters also by peft's rounding of the product, up to
        ``2**-8 * |product|`` (tests/generation/test_lora_sync.py measures both). The price is one
        float32 copy of ``W`` at a time.
        """
        a, b = self.whole(whole)
        wide = torch.promote_types(weight.dtype, torch.float32)
        out = weight.to(dtype=wide, copy=True)
        a, b = a.to(device=out.device, dtype=wide), b.to(device=out.device, dtype=wide)
        if self.fan_in_fan_out:
            out.addmm_(a.T, b.T, alpha=self.scaling)
        else:
            out.addmm_(b, a, alpha=self.scaling)
        return out.to(dtype)


def lora_terms(model: Any) -> dict[str, LoraTerm]:
    """Every adapted base weight of a peft model, by its state-dict name
    (``base_model.model....q_proj.base_layer.weight``), with its adapter; `Uncovered` (naming the
    first layer this cannot handle, and why) where the sync must merge in place instead."""
    from peft.tuners.lora.layer import Linear
    from peft.tuners.tuners_utils import BaseTunerLayer

    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    terms: dict[str, LoraTerm] = {}
    for name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if type(module) is not Linear:
            raise Uncovered(f"{name} is a {type(module).__name__} adapter layer "
                            "(only LoRA's Linear is added out of place)")
        if isinstance(module.base_layer, BaseTunerLayer):
            raise Uncovered(f"{name}: an adapter layer around another adapter layer")
        why = _uncovered_linear(module, uses)
        if why:
            raise Uncovered(f"{name}: {why}")
        adapter = module.active_adapters[0]
        if adapter not in module.lora_A:  # this layer has no such adapter: peft's merge skips it too
            continue
        terms[f"{name}.base_layer.weight"] = LoraTerm(
            a=module.lora_A[adapter].weight, b=module.lora_B[adapter].weight,
            scaling=float(module.scaling[adapter]), fan_in_fan_out=bool(module.fan_in_fan_out))
    return terms


def _uncovered_linear(module: Any, uses: Counter[int]) -> str | None:
    """Why a peft LoRA Linear layer cannot be added out of place (None: it can)."""
    adapters = list(module.active_adapters)
    if len(adapters) != 1:
        return f"{len(adapters)} active adapters ({', '.join(adapters) or 'none'})"
    adapter = adapters[0]
    if module.merged:
        return f"adapters {module.merged_adapters} are already merged into the base weight"
    if module.disable_adapters:
        return "its adapters are disabled"
    if adapter in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(adapter, False):
        return "a LoRA variant (DoRA or another) whose merge is not W + scaling * B @ A"
    if getattr(module, "lora_bias", {}).get(adapter, False):
        return "lora_bias (the base bias would change too)"
    if not isinstance(getattr(module.base_layer, "weight", None), torch.nn.Parameter):
        return "its base layer holds no weight parameter"
    if uses[id(module.base_layer.weight)] > 1:
        return "its base weight is tied to another module's"
    return None


__all__ = ["LoraTerm", "Uncovered", "lora_terms"]
