"""Log-probabilities and entropies of sampled tokens, without a float32 `[N, T, V]` copy.

A naive `logits.float().log_softmax(-1).gather(...)` makes a float32 copy of all logits (and
autograd keeps it). Here logits are processed in blocks of about `chunk_tokens` positions:
each block is upcast, reduced with `logsumexp`, and freed. The gradient is computed block by
block in a custom backward from the saved logits and the `[N, T]` logsumexp, so training
memory is the logits themselves plus one block. This is TRL's `selective_log_softmax` idea
(per-row `logsumexp`), with temperature folded in (TRL divides logits by the sampling
temperature before the softmax, in `_get_per_token_logps_and_entropies`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from grpocli.algorithms.packing import Rows, attention_implementation, model_attention_mask

#: Token positions per block; one float32 block holds `chunk_tokens * vocab_size * 4` bytes.
DEFAULT_CHUNK_TOKENS = 1024


def _blocks(n: int, t: int, chunk_tokens: int) -> Iterator[tuple[slice, slice]]:
    """Tile `[n, t]` into views of about `chunk_tokens` positions (slicing never copies)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    rows = max(1, min(n, chunk_tokens))
    cols = max(1, chunk_tokens // rows)
    for r in range(0, n, rows):
        for c in range(0, t, cols):
            yield slice(r, r + rows), slice(c, c + cols)


def _upcast(block: torch.Tensor, temperature: float) -> torch.Tensor:
    """A fresh float32 (or float64) copy of a block, divided in place by the temperature."""
    x = block.to(torch.promote_types(block.dtype, torch.float32), copy=True)  # [n, t, V]
    return x.div_(temperature) if temperature != 1.0 else x


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / temperature) at `labels`, forward and backward in blocks."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, temperature: float, chunk_tokens: int):
        n, t, _ = logits.shape
        out_dtype = torch.promote_types(logits.dtype, torch.float32)
        out = torch.empty(n, t, dtype=out_dtype, device=logits.device)  # [N, T]
        lse = torch.empty_like(out)  # [N, T]
        for rows, cols in _blocks(n, t, chunk_tokens):
            x = _upcast(logits[rows, cols], temperature)  # [n, t, V]
            lse[rows, cols] = torch.logsumexp(x, dim=-1)
            picked = x.gather(-1, labels[rows, cols].unsqueeze(-1)).squeeze(-1)  # [n, t]
            out[rows, cols] = picked - lse[rows, cols]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [N, T, V]
        n, t, _ = logits.shape
        for rows, cols in _blocks(n, t, ctx.chunk_tokens):
            x = _upcast(logits[rows, cols], ctx.temperature)  # [n, t, V]
            g = grad_out[rows, cols].unsqueeze(-1).to(x.dtype)  # [n, t, 1]
            # d logp(y) / d x = onehot(y) - softmax(x); d x / d logits = 1 / temperature
            block = x.sub_(lse[rows, cols].unsqueeze(-1)).exp_().mul_(-g)  # [n, t, V] = -g * softmax
            block.scatter_add_(-1, labels[rows, cols].unsqueeze(-1), g)
            grad[rows, cols] = block.div_(ctx.temperature).to(grad.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """`log softmax(logits / temperature)[labels]`: `logits [N, T, V]`, `labels [N, T]` -> `[N, T]`.

    The result is float32 (float64 for float64 logits) and differentiable with respect to
    `logits`; no float32 copy of more than one block of logits is kept.
    """
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    return _TokenLogprobs.apply(logits, labels.long(), float(temperature), int(chunk_tokens))


@torch.no_grad()
def token_entropy(
    logits: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """Entropy of `softmax(logits / temperature)` per position: `[N, T, V]` -> `[N, T]` float32.

    Computed in blocks, without gradient: it is a metric (TRL's `entropy`) and the input of
    entropy masking, not a loss term.
    """
    n, t, _ = logits.shape
    out = torch.empty(n, t, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for rows, cols in _blocks(n, t, chunk_tokens):
        logp = torch.log_softmax(_upcast(logits[rows, cols], temperature), dim=-1)  # [n, t, V]
        out[rows, cols] = -(logp.exp().mul_(logp)).sum(-1)
    return out


def differentiable_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy per position with gradient, for an entropy bonus in the loss: `[N, T, V]` -> `[N, T]`.

    Unlike `token_entropy` it keeps the float32 softmax of every position for backward; use it only
    when the loss has an entropy term.
    """
    logp = torch.log_softmax(_upcast(logits, temperature), dim=-1)  # [N, T, V]
    return -(logp.exp() * logp).sum(-1)


def sequence_logprobs(
    model: Any, rows: Rows, temperature: float, *, with_entropy: bool = False, entropy_grad: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every completion token of `rows` (grpocli.algorithms.packing, any layout),
    `[n, T]`, 0 where `rows.loss_mask` is 0 (and the entropy there, with gradient where
    `entropy_grad`), from one forward pass; logits only where a token is scored (`logits_to_keep`
    = `rows.logit_index`), so the vocabulary projection skips prompt positions."""
    device = next(model.parameters()).device
    mask = model_attention_mask(model, rows, device)
    varlen = {}
    if rows.cu_seqlens is not None and "flash" in (attention_implementation(model) or ""):
        cu = rows.cu_seqlens.to(device)  # packed rows: flash-attention's boundaries, not re-derived per layer
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": rows.max_seqlen,
                  "max_length_k": rows.max_seqlen}
    logits = model(
        input_ids=rows.input_ids.to(device), position_ids=rows.position_ids.to(device),
        attention_mask=mask,
        logits_to_keep=rows.logit_index.to(device), use_cache=False, **varlen,
    ).logits                                                       # [r, K, V] in the model's dtype
    index = rows.token_index.to(device)                            # [n, T] into the r*K scored tokens
    real = rows.loss_mask.to(device) > 0                           # [n, T]
    logp = token_logprobs(logits, rows.labels.to(device), temperature, chunk_tokens).flatten()[index]
    logp = logp.masked_fill(~real, 0.0)                            # [n, T]
    entropy = None
    if with_entropy:
        entropy = (differentiable_entropy(logits, temperature) if entropy_grad
                   else token_entropy(logits, temperature, chunk_tokens))
        entropy = entropy.flatten()[index].masked_fill(~real, 0.0)  # [n, T]
    return logp, entropy
