"""One optimizer step over micro-batches: the clipped surrogate, KL, aggregation, backward, update.

Phases: global counts (the normalisers, over every process) -> per micro-batch: log-probs ->
ratio and clipping -> KL -> engine importance weights -> named aggregation -> backward (gradients
synced at the last) -> clip the global gradient norm -> optimizer step (skipped on a non-finite
norm).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from grpocli.algorithms import KL_ESTIMATORS, LOSSES, LossNorm, clipped_surrogate, token_entropy, token_logprobs
from grpocli.trainer.batching import MicroBatch
from grpocli.trainer.packing import model_attention_mask

#: Sums accumulated over micro-batches and processes, turned into TRL's metric names.
STAT_KEYS = ("tokens", "kl", "entropy", "clip_low", "clip_high", "clip_region", "loss")


@dataclass(frozen=True)
class LossSettings:
    loss: str
    epsilon_low: float
    epsilon_high: float
    beta: float
    kl_estimator: str
    temperature: float
    max_completion_length: int


def sequence_logprobs(
    model: Any, mb: MicroBatch, temperature: float, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every completion token of the micro-batch, `[n, T]` (and entropy), from one
    forward pass over its rows; logits only at the `K` positions that score a token."""
    device = next(model.parameters()).device
    mask = model_attention_mask(model, mb.attention_mask)
    logits = model(
        input_ids=mb.input_ids.to(device), position_ids=mb.position_ids.to(device),
        attention_mask=mask.to(device) if mask is not None else None,
        logits_to_keep=mb.logit_index.to(device), use_cache=False,
    ).logits                                                       # [r, K, V] in the model's dtype
    index = mb.token_index.to(device)                              # [n, T] into the r*K scored tokens
    real = mb.loss_mask.to(device) > 0                             # [n, T]
    logp = token_logprobs(logits, mb.labels.to(device), temperature).flatten()[index]
    logp = logp.masked_fill(~real, 0.0)                            # [n, T]
    entropy = None
    if with_entropy:
        entropy = token_entropy(logits, temperature).flatten()[index].masked_fill(~real, 0.0)  # [n, T]
    return logp, entropy


def micro_batch_loss(
    model: Any, mb: MicroBatch, s: LossSettings, norm: LossNorm
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss, and masked sums for the metrics."""
    # 1. log-probs under the current policy                      # [n, T]
    logp, entropy = sequence_logprobs(model, mb, s.temperature, with_entropy=True)
    device = logp.device
    mask = mb.loss_mask.to(device)                                 # [n, T]
    # 2. ratio to the policy that generated (== 1 on the first update: old = detached current)
    old = mb.old_logp.to(device) if mb.old_logp is not None else logp.detach()
    per_token, low, high = clipped_surrogate(
        logp, old, mb.advantages.to(device), s.epsilon_low, s.epsilon_high
    )                                                              # [n, T]
    # 3. KL to the reference model
    kl = None
    if s.beta > 0 and mb.ref_logp is not None:
        kl = KL_ESTIMATORS[s.kl_estimator](logp, mb.ref_logp.to(device))  # [n, T]
        per_token = per_token + s.beta * kl
    # 4. engine/trainer mismatch: truncated importance sampling (TRL's order: after the KL term)
    if mb.is_weight is not None:
        per_token = per_token * mb.is_weight.to(device)
    # 5. the named aggregation (grpo, bnpo, dr_grpo, dapo): a share of the whole batch's loss
    loss = LOSSES[s.loss](per_token, mask, norm)
    with torch.no_grad():
        stats = {
            "tokens": float(mask.sum()),
            "kl": float((kl * mask).sum()) if kl is not None else 0.0,
            "entropy": float((entropy * mask).sum()) if entropy is not None else 0.0,
            "clip_low": float((low.float() * mask).sum()),
            "clip_high": float((high.float() * mask).sum()),
            "clip_region": float(((low | high).float() * mask).sum()),
            "loss": float(loss.detach()),
        }
    return loss, stats


def optimizer_step(
    accelerator: Any,
    model: Any,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[MicroBatch],
    s: LossSettings,
    *,
    max_grad_norm: float,
) -> dict[str, float]:
    """Backward over every micro-batch (gradients synced once, at the last), then one update.

    Returns the summed STAT_KEYS over all processes, `grad_norm`, `skipped`, the packing figures
    of `packing_stats` and this process's `time/forward_backward` and `time/optimizer`.
    """
    # 1. global counts: every aggregation divides by the whole batch, all processes together
    counts = global_counts(accelerator, micro_batches)
    sequences = int(counts["sequences"])
    totals = dict.fromkeys(STAT_KEYS, 0.0)
    packing = packing_stats(counts)
    if sequences == 0:  # every group had zero spread everywhere: nothing to learn from
        return {"skipped": 1.0, **totals, "grad_norm": 0.0, **packing}
    norm = LossNorm(
        num_sequences=sequences, num_tokens=max(int(counts["tokens"]), 1),
        max_completion_length=s.max_completion_length, num_micro_batches=max(int(counts["micro_batches"]), 1),
        world_size=accelerator.num_processes,
    )
    # 2. forward + backward per micro-batch; a process with none still joins the gradient sync
    t0 = time.perf_counter()
    batches = micro_batches or [None]
    for k, mb in enumerate(batches):
        last = k == len(batches) - 1
        with nullcontext() if last else accelerator.no_sync(model):
            if mb is None:
                loss, stats = _zero_loss(model), {}
            else:
                loss, stats = micro_batch_loss(model, mb, s, norm)
            accelerator.backward(loss * norm.world_size)  # undo DDP's mean over processes
        for key, value in stats.items():
            totals[key] += value
    # 3. clip, then step unless the gradient is not finite
    t1 = time.perf_counter()
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
    grad_norm = float(grad_norm)
    skipped = not math.isfinite(grad_norm)
    if not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timings = {"time/forward_backward": t1 - t0, "time/optimizer": time.perf_counter() - t1}
    summed = accelerator.reduce(torch.tensor([totals[k] for k in STAT_KEYS], dtype=torch.float64,
                                             device=accelerator.device), reduction="sum").tolist()
    return {**dict(zip(STAT_KEYS, summed)), "grad_norm": grad_norm, "skipped": float(skipped),
            **packing, **timings}


#: Counts over all micro-batches of all processes (one all-reduce).
COUNT_KEYS = ("sequences", "tokens", "micro_batches", "row_tokens", "sequence_tokens")


def global_counts(accelerator: Any, micro_batches: list[MicroBatch]) -> dict[str, float]:
    """Sequences, loss tokens, micro-batches, token slots the micro-batches' rows compute and
    tokens the sequences would take unpacked, summed over every process."""
    local = [
        sum(mb.num_sequences for mb in micro_batches), sum(mb.num_tokens for mb in micro_batches),
        len(micro_batches), sum(mb.row_tokens for mb in micro_batches),
        sum(mb.sequence_tokens for mb in micro_batches),
    ]
    summed = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device),
                                reduction="sum")
    return dict(zip(COUNT_KEYS, summed.tolist()))


def packing_stats(counts: dict[str, float]) -> dict[str, float]:
    """`packed_ratio`: micro-batches (forward passes) per sequence in the loss (1.0 = one each;
    with packed rows a micro-batch is one row, as in open-instruct's `val/packed_ratio`);
    `packed_token_ratio`: token slots the rows compute per token of the unpacked sequences
    (below 1.0 when completions share their prompt, above it with padding)."""
    sequences, tokens = counts["sequences"], counts["sequence_tokens"]
    return {
        "packed_ratio": counts["micro_batches"] / sequences if sequences else 0.0,
        "packed_token_ratio": counts["row_tokens"] / tokens if tokens else 0.0,
    }


def _zero_loss(model: Any) -> torch.Tensor:
    """A loss of 0 that still touches every parameter, so DDP's all-reduce happens."""
    return sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def fill_logprobs(model: Any, micro_batches: list[MicroBatch], temperature: float, attr: str) -> None:
    """Store the log-probs of a frozen pass (old policy or reference) on each micro-batch."""
    for mb in micro_batches:
        logp, _ = sequence_logprobs(model, mb, temperature)
        setattr(mb, attr, logp.detach().cpu())
