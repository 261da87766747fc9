"""FLOPs of the passes a GRPO step makes, from the model's exact shape and the step's token counts.

The shape is `grpo plan`'s (grpocli.planning.shapes.ModelShape: the model built from its config on
the meta device), so the linear layers are the model's own, whatever its config says of head_dim.
A forward pass over one token costs 2 FLOPs per weight of every matrix multiply it meets: each
decoder layer's linear layers (fan_in x fan_out each: the attention projections, whose width is
num_heads x head_dim and need not be hidden_size, as in Qwen3 or Gemma; the MLP) and the output
head (hidden_size x vocab_size); embeddings, norms and biases are not counted. Attention adds
4 * num_heads * head_dim FLOPs per layer for every earlier position a token attends to (QK^T and
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpocli.planning.shapes import ModelShape
    from grpocli.trainer.observer import Lengths


def matmul_weights(shape: ModelShape) -> int:
    """Weights of the matrix multiplies a token meets: every decoder layer's linear layers, and the head."""
    per_layer = sum(lin.fan_in * lin.fan_out for lin in shape.layer_linears)
    return shape.num_layers * per_layer + shape.hidden_size * shape.vocab_size


def attention_width(shape: ModelShape) -> int:
    """The width of a layer's queries (and of what attention returns): num_heads x head_dim."""
    return shape.num_heads * shape.head_dim


def forward_flops(shape: ModelShape, tokens: int, attended: int) -> float:
    """One forward pass over `tokens` tokens that attend to `attended` earlier-or-same positions in all."""
    return 2.0 * matmul_weights(shape) * tokens + 4.0 * shape.num_layers * attention_width(shape) * attended


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


def group_tokens(prompt_tokens: Sequence[int], completion_lengths: Sequence[int],
                 keep: Sequence[bool] | None = None) -> list[GroupTokens]:
    """Groups of a batch: `prompt_tokens [B]`, `completion_lengths [B*G]` (prompt-major), `keep [B*G]`
    (the rows that enter the loss; None: all)."""
    b = len(prompt_tokens)
    g = len(completion_lengths) // max(b, 1)
    out = []
    for i in range(b):
        rows = range(i * g, (i + 1) * g)
        lengths = [int(completion_lengths[k]) for k in rows if keep is None or keep[k]]
        if lengths:
            out.append(GroupTokens(int(prompt_tokens[i]), lengths))
    return out


def groups_of(lengths: Lengths) -> list[GroupTokens]:
    """The groups of a batch the training loop reported (grpocli.trainer.observer.Lengths)."""
    return group_tokens(lengths.prompts, lengths.completions, lengths.keep)


def passes_flops(shape: ModelShape, groups: Sequence[GroupTokens], *, passes: float = 1.0) -> float:
    """`passes` forward passes (3.0: forward + backward of full training) over the groups."""
    return passes * sum(forward_flops(shape, grp.tokens, grp.attended) for grp in groups)


def training_passes(lora: bool) -> float:
    """Forward + backward in forward-pass units: 3 with every weight trained, 2 with LoRA."""
    return 2.0 if lora else 3.0
