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


def logprobs_from_model(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    logits_to_keep: int,
    temperature: float = 1.0,
    position_ids: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `logits_to_keep` tokens of each row under a causal LM.

    `input_ids [N, L]` (prompt + completion; left-padded prompts and right-padded completions as
    TRL lays them out), `attention_mask [N, L]`. Returns `(logp [N, K], entropy [N, K] | None)`
    with `K = logits_to_keep` and `logp[:, j] = log p(input_ids[:, L-K+j] | input_ids[:, :L-K+j])`
    at the given sampling temperature, as TRL's `_get_per_token_logps_and_entropies`.

    Packed rows (several sequences per row): pass `position_ids` restarting at 0 for each
    sequence and `attention_mask=None`; transformers then keeps attention inside each sequence.
    Use `logits_to_keep = L - 1` and select completion tokens with a mask over `[:, 1:]`.
    Without `position_ids` positions count from the first column, padding included (as in TRL);
    rotary models do not notice the shift, absolute-position models (GPT-2) do: for those pass
    `(attention_mask.cumsum(-1) - 1).clamp(min=0)`, which is what `generate` uses.
    """
    length = input_ids.shape[1]
    if not 1 <= logits_to_keep < length:
        raise ValueError(f"logits_to_keep must be in [1, {length - 1}] for rows of {length} tokens")
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    # One extra position: the logit at position i scores the token at i + 1.
    logits = model(**kwargs, logits_to_keep=logits_to_keep + 1).logits[:, :-1, :]  # [N, K, V]
    labels = input_ids[:, -logits_to_keep:]  # [N, K]
    logp = token_logprobs(logits, labels, temperature, chunk_tokens)
    entropy = token_entropy(logits, temperature, chunk_tokens) if with_entropy else None
    return logp, entropy
