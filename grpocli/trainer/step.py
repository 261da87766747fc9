"""One optimizer step over micro-batches: the named loss, KL, aggregation, backward, update.

Phases: global counts (the normalisers, over every process) -> per micro-batch: log-probs ->
importance ratio (token or sequence) -> the loss's per-token objective -> high-entropy token
filter -> engine importance weights -> KL -> named aggregation -> entropy bonus -> backward
(gradients synced at the last) -> clip the global gradient norm -> optimizer step (skipped on a
non-finite norm). The order of the per-token terms is TRL 1.16's (`_compute_loss`).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpocli.algorithms import (
    KL_ESTIMATORS,
    LOSSES,
    OWN_ENGINE_WEIGHTS,
    SURROGATES,
    LossNorm,
    PolicyTerms,
    SurrogateSettings,
    high_entropy_mask,
    importance_ratio,
    token_entropy,
    token_logprobs,
)
from grpocli.algorithms.logprobs import differentiable_entropy
from grpocli.trainer.batching import MicroBatch, OptimizerBatch
from grpocli.trainer.deepspeed import even, idle, mark_boundary, needs_pass
from grpocli.trainer.packing import model_attention_mask

#: Sums accumulated over micro-batches and processes, turned into TRL's metric names.
STAT_KEYS = ("tokens", "kl", "entropy", "clip_low", "clip_high", "clip_region", "loss")


@dataclass(frozen=True)
class LossSettings:
    """The [algorithm] keys the loss reads (grpocli.recipe.algorithm_section documents them)."""

    loss: str
    beta: float
    kl_estimator: str
    temperature: float
    max_completion_length: int
    surrogate: SurrogateSettings = SurrogateSettings()  # clip range and each objective's parameters
    importance_sampling_level: str = "token"
    kl_importance_correction: bool = False
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0

    @classmethod
    def from_recipe(cls, recipe: Any) -> LossSettings:
        a = recipe.algorithm
        own = [f for f in cls.__dataclass_fields__ if f not in ("temperature", "max_completion_length", "surrogate")]
        surrogate = SurrogateSettings(**{f: getattr(a, f) for f in SurrogateSettings.__dataclass_fields__})
        return cls(temperature=recipe.generation.temperature,
                   max_completion_length=recipe.generation.max_completion_length, surrogate=surrogate,
                   **{name: getattr(a, name) for name in own})

    @property
    def zero_advantage_rows_matter(self) -> bool:
        """Whether a row with advantage 0 can change the gradient (KL, entropy terms) or a
        normaliser that only its forward pass sees (bnpo's micro-batch tokens, the entropy quantile)."""
        return self.beta > 0 or self.entropy_coef > 0 or self.top_entropy_quantile < 1.0 or self.loss == "bnpo"


Forward = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


def sequence_logprobs(
    model: Any, mb: MicroBatch, temperature: float, *, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every completion token of the micro-batch, `[n, T]` (and entropy, with gradient
    where `entropy_grad`), from one forward pass over its rows; logits only where a token is scored."""
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
        entropy_of = differentiable_entropy if entropy_grad else token_entropy
        entropy = entropy_of(logits, temperature).flatten()[index].masked_fill(~real, 0.0)  # [n, T]
    return logp, entropy


def micro_batch_loss(
    model: Any, mb: MicroBatch, s: LossSettings, norm: LossNorm, forward: Forward = sequence_logprobs,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss, and masked sums for the metrics."""
    # 1. log-probs (and entropy) under the current policy           # [n, T]
    logp, entropy = forward(model, mb, s.temperature, with_entropy=True, entropy_grad=s.entropy_coef > 0)
    device = logp.device
    mask = mb.loss_mask.to(device=device, dtype=logp.dtype)         # [n, T]
    advantages = mb.advantages.to(device).unsqueeze(1)              # [n, 1]
    # 2. importance ratio to the policy that generated (== 1 on the first update: old = detached current)
    old = mb.old_logp.to(device) if mb.old_logp is not None else logp.detach()
    log_ratio = logp - old                                          # [n, T]
    ratio = importance_ratio(log_ratio, mask, s.importance_sampling_level)  # [n, T] or [n, 1] (GSPO)
    engine = mb.is_weight.to(device) if mb.is_weight is not None else None
    # 3. the loss's per-token objective (clipped surrogate, cispo, sapo, vespo)
    terms = PolicyTerms(logp=logp, log_ratio=log_ratio, ratio=ratio, advantages=advantages, mask=mask,
                        engine_weight=engine)
    per_token, low, high = SURROGATES[s.loss](terms, s.surrogate)   # [n, T] or [n, 1]
    # 4. only the high-entropy tokens carry the policy gradient ("80/20")
    kept = mask
    if s.top_entropy_quantile < 1.0:
        kept = high_entropy_mask(entropy, mask, s.top_entropy_quantile)  # [n, T]
        per_token = per_token * kept
    # 5. engine/trainer mismatch: importance weights on the policy term (vespo weighs them itself)
    if engine is not None and s.loss not in OWN_ENGINE_WEIGHTS:
        per_token = per_token * engine
    # 6. KL to the reference model (times the importance ratio: TRL's use_bias_correction_kl)
    kl = None
    if s.beta > 0 and mb.ref_logp is not None:
        kl = KL_ESTIMATORS[s.kl_estimator](logp, mb.ref_logp.to(device))  # [n, T]
        if s.kl_importance_correction:
            kl = kl * ratio
        per_token = per_token + s.beta * kl
    # 7. the named aggregation: a share of the whole batch's loss
    loss = LOSSES[s.loss](per_token, mask, norm)
    # 8. entropy bonus: coef x the mean entropy of the step's loss tokens (of the kept ones, filtered)
    if s.entropy_coef > 0:
        loss = loss - s.entropy_coef * (entropy * kept).sum() / max(norm.num_tokens, 1)
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
    batch: OptimizerBatch,
    s: LossSettings,
    *,
    max_grad_norm: float,
    forward: Forward = sequence_logprobs,
) -> dict[str, float]:
    """Backward over every micro-batch (gradients synced once, at the last), then one update.

    Returns the summed STAT_KEYS over all processes, `grad_norm`, `skipped`, the packing figures
    of `packing_stats` and this process's `time/forward_backward` and `time/optimizer`.
    `forward` computes a micro-batch's log-probs (the model's, unless a test gives others).
    """
    # 1. global counts: every aggregation divides by the whole batch, all processes together
    counts = global_counts(accelerator, batch)
    totals = dict.fromkeys(STAT_KEYS, 0.0)
    packing = packing_stats(counts)
    if counts["computed"] == 0:  # nothing can move the weights: every group was flat, everywhere
        return {"skipped": 1.0, **totals, "grad_norm": 0.0, **packing}
    norm = LossNorm(
        num_sequences=int(counts["sequences"]), num_tokens=max(int(counts["tokens"]), 1),
        max_completion_length=s.max_completion_length, num_micro_batches=max(int(counts["micro_batches"]), 1),
        world_size=accelerator.num_processes, token_mean_tokens=batch.token_mean_tokens,
    )
    # 2. forward + backward per micro-batch; a process with none still joins the gradient sync
    t0 = time.perf_counter()
    micro_batches = even(model, batch.micro_batches) or [None]  # FSDP2, DeepSpeed: as many passes everywhere
    for k, mb in enumerate(micro_batches):
        last = k == len(micro_batches) - 1
        with nullcontext() if last else accelerator.no_sync(model):
            if mb is None:
                loss, stats = _zero_loss(model), {}
            else:
                loss, stats = micro_batch_loss(model, mb, s, norm, forward)
            mark_boundary(accelerator, last)  # DeepSpeed: clips and steps after the last backward only
            accelerator.backward(loss * norm.world_size)  # undo DDP's (DeepSpeed's) mean over processes
        for key, value in stats.items():
            totals[key] += value
    # 3. clip, then step unless the gradient is not finite (DeepSpeed: done in the last backward,
    #    which skips a non-finite update itself; clip_grad_norm_ and step only report and do nothing)
    t1 = time.perf_counter()
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)  # FSDP2: a DTensor
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
COUNT_KEYS = ("sequences", "tokens", "computed", "micro_batches", "row_tokens", "sequence_tokens")


def global_counts(accelerator: Any, batch: OptimizerBatch) -> dict[str, float]:
    """Summed over every process: sequences and loss tokens in the loss (idle ones included),
    sequences computed, micro-batches, token slots their rows compute and tokens the computed
    sequences would take unpacked."""
    mbs = batch.micro_batches
    computed = sum(mb.num_sequences for mb in mbs)
    local = [
        computed + batch.idle_sequences, sum(mb.num_tokens for mb in mbs) + batch.idle_tokens, computed,
        len(mbs), sum(mb.row_tokens for mb in mbs), sum(mb.sequence_tokens for mb in mbs),
    ]
    summed = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device),
                                reduction="sum")
    return dict(zip(COUNT_KEYS, summed.tolist()))


def packing_stats(counts: dict[str, float]) -> dict[str, float]:
    """`packed_ratio`: micro-batches (forward passes) per sequence in the loss (1.0 = one each;
    with packed rows a micro-batch is one row, as in open-instruct's `val/packed_ratio`);
    `packed_token_ratio`: token slots the rows compute per token of the unpacked sequences
    (below 1.0 when completions share their prompt, above it with padding)."""
    sequences, tokens = counts["computed"], counts["sequence_tokens"]
    return {
        "packed_ratio": counts["micro_batches"] / sequences if sequences else 0.0,
        "packed_token_ratio": counts["row_tokens"] / tokens if tokens else 0.0,
    }


def _zero_loss(model: Any) -> torch.Tensor:
    """A loss of 0 that still touches every parameter, so DDP's all-reduce happens (FSDP2, DeepSpeed: a pass)."""
    if needs_pass(model):
        return idle(model)
    return sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def fill_logprobs(model: Any, micro_batches: list[MicroBatch], temperature: float, attr: str) -> None:
    """Store the log-probs of a frozen pass (old policy or reference) on each micro-batch."""
    for mb in even(model, micro_batches):
        if mb is None:  # FSDP2, ZeRO-3: this process has fewer micro-batches than another
            idle(model)
            continue
        logp, _ = sequence_logprobs(model, mb, temperature)
        setattr(mb, attr, logp.detach().cpu())
