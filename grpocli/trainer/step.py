"""One optimizer step over micro-batches: the named loss, KL, aggregation, backward, update; and the
frozen log-prob passes that give the loss its fixed inputs.

Phases of `optimizer_step`: global counts (the normalisers, over every process) -> per
micro-batch: log-probs -> importance ratio (token or sequence) -> the loss's per-token objective
-> high-entropy token filter -> engine importance weights -> KL -> named aggregation -> entropy
bonus -> backward (gradients reduced at the last) -> clip the global gradient norm -> optimizer
step (skipped on a non-finite norm). The order of the per-token terms is TRL 1.16's
(`_compute_loss`). The loss (objective, aggregation, properties) and the KL estimator are entries
of grpocli.algorithms.variants; how the processes share a pass, the parallel strategy
(grpocli.parallel) says.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Any

import torch

from grpocli.algorithms.logprobs import DEFAULT_CHUNK_TOKENS, sequence_logprobs
from grpocli.algorithms.losses import LossNorm
from grpocli.parallel import Parallel
from grpocli.parallel.strategy import idle_forward
from grpocli.trainer.batching import MicroBatch, OptimizerBatch, regroup
from grpocli.trainer.loss import (  # noqa: F401 - the step's names for its callers
    EXTREME_KEYS,
    STAT_KEYS,
    Forward,
    Frozen,
    LossSettings,
    Sums,
    micro_batch_loss,
)
from grpocli.trainer.memory_budget import MemoryBudget, OutOfMemory, is_out_of_memory
from grpocli.trainer.offloading import ActivationOffloading


def optimizer_step(
    parallel: Parallel, model: Any, optimizer: torch.optim.Optimizer, batch: OptimizerBatch, frozen: Frozen,
    s: LossSettings, *, max_grad_norm: float, forward: Forward = sequence_logprobs,
    offload: ActivationOffloading | None = None, budget: MemoryBudget | None = None,
) -> dict[str, float]:
    """Backward over every micro-batch (gradients reduced once, at the last), then one update.

    Returns the summed STAT_KEYS over all processes, EXTREME_KEYS (NaN where no sequence has a loss
    token; rows not computed, whose advantage is 0, have no clipped token), `grad_norm`, `skipped`, the packing figures
    of `packing_stats` and this process's `time/forward_backward` and `time/optimizer`.
    `forward` computes a micro-batch's log-probs (the model's, unless a test gives others); `offload`
    (train.activation_offloading) takes what each forward saves for backward to host memory. A pass out of
    memory (a CUDA allocation, or past `budget`: train.memory_limit) raises OutOfMemory on every process
    once each has run its passes (the rest idle), the gradients cleared and no update made.
    """
    # 1. global counts: every aggregation divides by the whole batch, all processes together
    counts = global_counts(parallel, batch)
    packing = packing_stats(counts)
    if counts["computed"] == 0:  # nothing can move the weights: every group was flat, everywhere
        return {"skipped": 1.0, **dict.fromkeys(STAT_KEYS, 0.0), **dict.fromkeys(EXTREME_KEYS, math.nan),
                "grad_norm": 0.0, **packing}
    norm = LossNorm(
        num_sequences=int(counts["sequences"]), num_tokens=max(int(counts["tokens"]), 1),
        max_completion_length=s.max_completion_length, num_micro_batches=max(int(counts["micro_batches"]), 1),
        world_size=parallel.size, token_mean_tokens=batch.token_mean_tokens,
    )
    # 2. forward + backward per micro-batch; a process with fewer (or none) still joins each reduction
    #    (train.sequence_parallel: the processes of a split run each one's micro-batches together)
    t0 = time.perf_counter()
    sums = Sums(parallel.device, idle=batch.idle_sequences > 0)
    if parallel.split is not None:
        from grpocli.trainer.split_passes import split_training_passes

        split_training_passes(parallel, model, batch, frozen, s, norm, offload, sums)
        failed = None
    else:
        failed = _training_passes(parallel, model, batch, frozen, s, norm, forward, offload, budget, sums)
    totals, least = sums.totals, sums.least
    if failed is not None if parallel.size == 1 else parallel.any_process(failed is not None):
        optimizer.zero_grad(set_to_none=True)  # the step starts again from its saved start: no update was made
        raise failed or OutOfMemory("training")
    # 3. clip, then step unless the gradient is not finite (DeepSpeed: done in the last backward,
    #    which skips a non-finite update itself; clipping and step only report and do nothing)
    t1 = time.perf_counter()
    grad_norm = parallel.clip_grad_norm(model, max_grad_norm)
    skipped = not math.isfinite(grad_norm)
    parallel.step(optimizer, finite=not skipped)
    timings = {"time/forward_backward": t1 - t0, "time/optimizer": time.perf_counter() - t1}
    summed = parallel.sums(totals)  # the one host sync of the step's figures
    low_min, neg_high_max = parallel.gather(least).view(-1, 2).min(dim=0).values.tolist()
    extremes = {"clip_low_min": low_min if math.isfinite(low_min) else math.nan,
                "clip_high_max": -neg_high_max if math.isfinite(neg_high_max) else math.nan}
    return {**dict(zip(STAT_KEYS, summed)), **extremes, "grad_norm": grad_norm, "skipped": float(skipped),
            **packing, **timings}


def _training_passes(parallel: Parallel, model: Any, batch: OptimizerBatch, frozen: Frozen, s: LossSettings,
                     norm: LossNorm, forward: Forward, offload: ActivationOffloading | None,
                     budget: MemoryBudget | None, sums: Sums) -> OutOfMemory | None:
    """Forward and backward of each micro-batch into `sums`; the first pass out of memory (the rest idle)."""
    passes = parallel.backward_passes(list(batch.micro_batches))  # [None: an idle pass]
    failed: OutOfMemory | None = None  # a pass past the memory budget: the rest idle, then the step is redone
    for k, mb in enumerate(passes):
        last = k == len(passes) - 1
        with parallel.accumulating(model, last):  # DDP: reduce at the last; DeepSpeed: step after it
            if mb is not None and failed is None:
                try:
                    stats = _training_pass(parallel, model, mb, frozen.of(k), s, norm, forward, offload, budget)
                except Exception as exc:  # noqa: BLE001 - only an out-of-memory is kept; the rest raise
                    if not is_out_of_memory(exc):
                        raise
                    failed = _out_of_memory(exc, "training", mb)  # the exception (and its frames) go here
                else:
                    sums.add(stats)
                    continue
            if failed is not None and parallel.size == 1:
                break
            parallel.backward(parallel.idle_loss(model))  # scaled by the processes: their gradients are averaged
    return failed


def _training_pass(parallel: Parallel, model: Any, mb: MicroBatch, frozen: tuple[torch.Tensor | None, ...],
                   s: LossSettings, norm: LossNorm, forward: Forward, offload: ActivationOffloading | None,
                   budget: MemoryBudget | None) -> torch.Tensor:
    """Forward and backward of one micro-batch; its figures (`micro_batch_loss`); OutOfMemory when it took
    more than the budget (train.memory_limit)."""
    if budget is not None:
        budget.start()
    with offload if offload is not None else nullcontext():  # the forward only: backward unpacks
        loss, stats = micro_batch_loss(model, mb, frozen, s, norm, forward)
    parallel.backward(loss)  # scaled by the processes: their gradients are averaged
    if budget is not None:
        budget.check("training", mb.num_sequences, _longest(mb))
    return stats.to(parallel.device)


def _longest(mb: MicroBatch) -> int:
    """Tokens of the micro-batch's longest sequence (prompt + completion; of its widest row, for several)."""
    return mb.sequence_tokens if mb.num_sequences == 1 else int(mb.input_ids.shape[-1])


def _out_of_memory(exc: BaseException, phase: str, mb: MicroBatch) -> OutOfMemory:
    """What failed, kept without the exception (whose frames hold the pass's tensors)."""
    if isinstance(exc, OutOfMemory):
        return exc
    return OutOfMemory(phase, mb.num_sequences, _longest(mb))


#: Counts over all micro-batches of all processes (one all-reduce).
COUNT_KEYS = ("sequences", "tokens", "computed", "micro_batches", "row_tokens", "sequence_tokens")


def global_counts(parallel: Parallel, batch: OptimizerBatch) -> dict[str, float]:
    """Summed over every process: sequences and loss tokens in the loss (idle ones included),
    sequences computed, micro-batches, token slots their rows compute and tokens the computed
    sequences would take unpacked."""
    mbs = batch.micro_batches
    computed = sum(mb.num_sequences for mb in mbs)
    local = [
        computed + batch.idle_sequences, sum(mb.num_tokens for mb in mbs) + batch.idle_tokens, computed,
        len(mbs), sum(mb.row_tokens for mb in mbs), sum(mb.sequence_tokens for mb in mbs),
    ]
    return dict(zip(COUNT_KEYS, parallel.sums(local)))


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


@torch.no_grad()
def frozen_logprobs(parallel: Parallel, model: Any, micro_batches: tuple[MicroBatch, ...],
                    temperature: float, chunks: tuple[MicroBatch, ...] | None = None,
                    budget: MemoryBudget | None = None,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> tuple[torch.Tensor, ...]:
    """The log-probs `[n, T]` of each micro-batch under `model` (the policy before it moves, or the
    reference), on its device; where each forward is a collective, idle passes keep the processes in step.
    `chunks` (grpocli.trainer.batching.logprob_chunks): the passes to run instead of the micro-batches
    (train.logprob_micro_batch_size), their log-probs put back into the micro-batches' shapes."""
    out, failed = [], None
    passes = list(micro_batches if chunks is None else chunks)
    if parallel.split is not None:  # train.sequence_parallel: the split runs each one's passes together
        from grpocli.trainer.split_passes import split_logprob_passes

        with parallel.autocast():
            out = split_logprob_passes(parallel, model, passes, temperature, chunk_tokens)
        return tuple(out) if chunks is None else regroup(tuple(out), chunks, micro_batches)
    with parallel.autocast():  # the policy's mixed precision (a reference's forward has none of its own)
        for mb in parallel.forward_passes(passes):
            if mb is not None and failed is None:
                try:
                    out.append(_logprob_pass(model, mb, temperature, budget, chunk_tokens))
                except Exception as exc:  # noqa: BLE001 - only an out-of-memory is kept; the rest raise
                    if not is_out_of_memory(exc):
                        raise
                    failed = _out_of_memory(exc, "log-prob", mb)
                else:
                    continue
            if failed is not None and parallel.size == 1:
                break
            idle_forward(model)  # this process has fewer passes than another (or one failed)
    if failed is not None if parallel.size == 1 else parallel.any_process(failed is not None):
        raise failed or OutOfMemory("log-prob")
    return tuple(out) if chunks is None else regroup(tuple(out), chunks, micro_batches)


def _logprob_pass(model: Any, mb: MicroBatch, temperature: float, budget: MemoryBudget | None,
                  chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    if budget is not None:
        budget.start()
    logp, _ = sequence_logprobs(model, mb, temperature, chunk_tokens=chunk_tokens)
    if budget is not None:
        budget.check("log-prob", mb.num_sequences, _longest(mb))
    return logp.detach()  # on the model's device: the loss reads it there
