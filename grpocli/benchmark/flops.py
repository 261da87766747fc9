"""FLOPs of the passes a GRPO step makes, from the model's config and the step's token counts.

A forward pass over one token costs 2 FLOPs per weight of every matrix multiply it meets (the
attention projections, the MLP, the output head; embeddings and norms are not counted), plus
attention: 4 * hidden_size FLOPs per layer for every earlier position it attends to (QK^T and
the weighted sum of V, over all heads). Backward is twice the forward when every weight trains
(gradients of activations and of weights), once with LoRA (activations only: the adapters are
too small to count). The counts are of the work each pass needs, as grpo does it:

    generation     each prompt once per group (prefix shared), then every completion token
    log-prob pass  forward over the kept groups (prompt once per group, every completion)
    training       forward + backward over the same tokens
Padding and the groups a step drops (no reward spread) are not counted: MFU is useful work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a decoder-only transformer's FLOPs."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a transformers config (Llama, Qwen2, Mistral, ... names)."""
        heads = config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size, num_layers=config.num_hidden_layers, num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
        )

    @property
    def matmul_weights(self) -> int:
        """Weights of the matrix multiplies a token meets (q, k, v, o, gate, up, down per layer; the head)."""
        h, head_dim = self.hidden_size, self.hidden_size // self.num_heads
        kv = self.num_kv_heads * head_dim
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size
        return self.num_layers * per_layer + h * self.vocab_size

    def forward(self, tokens: int, attended: int) -> float:
        """One forward pass over `tokens` tokens that attend to `attended` earlier-or-same positions in all."""
        return 2.0 * self.matmul_weights * tokens + 4.0 * self.num_layers * self.hidden_size * attended


@dataclass(frozen=True)
class GroupTokens:
    """One prompt and its G completions: the token counts the FLOPs need."""

    prompt: int                 # prompt tokens
    completions: Sequence[int]  # [G] completion tokens of each

    @property
    def tokens(self) -> int:
        """Tokens computed once each (the prompt shared by the group)."""
        return self.prompt + sum(self.completions)

    @property
    def attended(self) -> int:
        """Positions attended, summed over those tokens (causal: each sees itself and all before)."""
        p = self.prompt
        return p * (p + 1) // 2 + sum(c * p + c * (c + 1) // 2 for c in self.completions)


def group_tokens(prompt_ids: Sequence[Sequence[int]], completion_lengths: Sequence[int],
                 keep: Sequence[bool] | None = None) -> list[GroupTokens]:
    """Groups of a batch: `prompt_ids [B][Tp]`, `completion_lengths [B*G]` (prompt-major), `keep [B*G]`
    (the rows that enter the loss; None: all)."""
    b = len(prompt_ids)
    g = len(completion_lengths) // max(b, 1)
    out = []
    for i in range(b):
        rows = range(i * g, (i + 1) * g)
        lengths = [int(completion_lengths[k]) for k in rows if keep is None or keep[k]]
        if lengths:
            out.append(GroupTokens(len(prompt_ids[i]), lengths))
    return out


def passes_flops(shape: ModelShape, groups: Sequence[GroupTokens], *, passes: float = 1.0) -> float:
    """`passes` forward passes (3.0: forward + backward of full training) over the groups."""
    return passes * sum(shape.forward(grp.tokens, grp.attended) for grp in groups)


def training_passes(lora: bool) -> float:
    """Forward + backward in forward-pass units: 3 with every weight trained, 2 with LoRA."""
    return 2.0 if lora else 3.0
