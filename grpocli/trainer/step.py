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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from grpocli.algorithms.logprobs import DEFAULT_CHUNK_TOKENS, sequence_logprobs
from grpocli.algorithms.losses import (
    LossNorm,
    PolicyTerms,
    SurrogateSettings,
    high_entropy_mask,
    importance_ratio,
)
from grpocli.algorithms.variants import KL_ESTIMATORS, LOSSES
from grpocli.parallel import Parallel
from grpocli.parallel.strategy import idle_forward
from grpocli.trainer.batching import MicroBatch, OptimizerBatch, regroup
from grpocli.trainer.memory_budget import MemoryBudget, OutOfMemory, is_out_of_memory
from grpocli.trainer.offloading import ActivationOffloading

if TYPE_CHECKING:
    from grpocli.recipe.algorithm_section import AlgorithmSection
    from grpocli.recipe.distill_section import DistillSection
    from grpocli.recipe.schema import GenerationSection

#: Sums accumulated over micro-batches and processes, turned into TRL's metric names.
STAT_KEYS = ("tokens", "kl", "entropy", "clip_low", "clip_high", "clip_region", "loss", "teacher_kl")
#: TRL's clip_ratio/low_min and /high_max: the least share of low-clipped tokens of a sequence and the
#: largest share of high-clipped ones, over every sequence with loss tokens (after STAT_KEYS in a
#: micro-batch's figures; the least and largest over micro-batches and processes, not sums).
EXTREME_KEYS = ("clip_low_min", "clip_high_max")


@dataclass(frozen=True)
class LossSettings:
    """The [algorithm] keys the loss reads (grpocli.recipe.algorithm_section documents them), with
    the loss's and KL estimator's functions and properties taken from their entries."""

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
    distill: str | None = None          # [distill] objective: 'reverse_kl', 'reward_plus_kl' (None: no teacher)
    distill_coef: float = 1.0
    distill_kl_estimator: str = "k2"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS  # train.logits_chunk_tokens: logits upcast at once
    objective: Callable[..., Any] = field(init=False, repr=False, compare=False)    # LOSSES[loss]'s
    aggregation: Callable[..., Any] = field(init=False, repr=False, compare=False)  # LOSSES[loss]'s

    def __post_init__(self) -> None:
        entry = LOSSES[self.loss]
        object.__setattr__(self, "objective", entry.objective_fn)
        object.__setattr__(self, "aggregation", entry.aggregation_fn)

    @classmethod
    def of(cls, algorithm: AlgorithmSection, generation: GenerationSection,
           distill: DistillSection | None = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> LossSettings:
        a = algorithm
        surrogate = SurrogateSettings(**{f: getattr(a, f) for f in SurrogateSettings.__dataclass_fields__})
        d = distill if distill is not None and distill.on else None
        return cls(loss=a.loss, beta=a.beta, kl_estimator=a.kl_estimator, temperature=generation.temperature,
                   max_completion_length=generation.max_completion_length, surrogate=surrogate,
                   importance_sampling_level=a.importance_sampling_level,
                   kl_importance_correction=a.kl_importance_correction, entropy_coef=a.entropy_coef,
                   top_entropy_quantile=a.top_entropy_quantile, distill=d.objective if d else None,
                   distill_coef=d.coef if d else 1.0, distill_kl_estimator=d.kl_estimator if d else "k2",
                   chunk_tokens=chunk_tokens)

    @property
    def kl(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return KL_ESTIMATORS[self.kl_estimator].fn

    @property
    def zero_advantage_rows_matter(self) -> bool:
        """Whether a row with advantage 0 can change the gradient (KL, entropy terms) or a
        normaliser that only its forward pass sees (a per-micro-batch loss, the entropy quantile)."""
        return (self.beta > 0 or self.entropy_coef > 0 or self.top_entropy_quantile < 1.0
                or LOSSES[self.loss].per_micro_batch or self.distill is not None)


@dataclass(frozen=True)
class Frozen:
    """The loss's fixed inputs for one optimizer batch, from passes without gradient: one tensor
    per micro-batch, in the batch's order (None: not needed)."""

    old_logp: tuple[torch.Tensor, ...] | None = None   # [n, T] each: the policy that generated
                                                      # (None: the current one, detached)
    ref_logp: tuple[torch.Tensor, ...] | None = None   # [n, T] each: the reference model (beta > 0)
    is_weight: tuple[torch.Tensor, ...] | None = None  # [n, T] or [n, 1] each: engine importance weights
    teacher_logp: tuple[torch.Tensor, ...] | None = None  # [n, T] each: the distillation teacher ([distill])

    def of(self, k: int) -> tuple[torch.Tensor | None, ...]:
        """(old_logp, ref_logp, is_weight, teacher_logp) of micro-batch k."""
        return tuple(None if part is None else part[k] for part in self.parts())

    def parts(self) -> tuple[tuple[torch.Tensor, ...] | None, ...]:
        """The fields in the order of `of` (and of the constructor)."""
        return (self.old_logp, self.ref_logp, self.is_weight, self.teacher_logp)


Forward = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


def micro_batch_loss(
    model: Any, mb: MicroBatch, frozen: tuple[torch.Tensor | None, ...], s: LossSettings, norm: LossNorm,
    forward: Forward = sequence_logprobs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This micro-batch's share of the batch loss, and masked sums for the metrics (`[10]` float64,
    STAT_KEYS' then EXTREME_KEYS' order, on the model's device: no host sync per micro-batch); `frozen` is its
    (old_logp, ref_logp, is_weight, teacher_logp) (`Frozen.of`)."""
    old_logp, ref_logp, is_weight, teacher_logp = (*frozen, None)[:4]  # 3 given: no teacher
    # 1. log-probs (and entropy) under the current policy           # [n, T]
    logp, entropy = forward(model, mb, s.temperature, with_entropy=True, entropy_grad=s.entropy_coef > 0,
                            chunk_tokens=s.chunk_tokens)
    device = logp.device
    mask = mb.loss_mask.to(device=device, dtype=logp.dtype)         # [n, T]
    advantages = mb.advantages.to(device).unsqueeze(1)              # [n, 1]
    # 2. importance ratio to the policy that generated (== 1 on the first update: old = detached current)
    old = old_logp.to(device) if old_logp is not None else logp.detach()
    log_ratio = logp - old                                          # [n, T]
    ratio = importance_ratio(log_ratio, mask, s.importance_sampling_level)  # [n, T] or [n, 1] (GSPO)
    engine = is_weight.to(device) if is_weight is not None else None
    teacher = teacher_logp.to(device) if teacher_logp is not None else None
    teacher_gap = (old - teacher) * mask if teacher is not None else None  # [n, T] sampled reverse KL to the teacher
    if s.distill == "reverse_kl" and teacher_gap is not None:  # on-policy distillation: a per-token advantage
        advantages = -s.distill_coef * teacher_gap                  # [n, T] coef x (teacher - student)
    # 3. the loss's per-token objective (clipped surrogate, cispo, sapo, vespo)
    terms = PolicyTerms(logp=logp, log_ratio=log_ratio, ratio=ratio, advantages=advantages, mask=mask,
                        engine_weight=engine)
    per_token, low, high = s.objective(terms, s.surrogate)         # [n, T] or [n, 1]
    # 4. only the high-entropy tokens carry the policy gradient ("80/20")
    kept = mask
    if s.top_entropy_quantile < 1.0:
        kept = high_entropy_mask(entropy, mask, s.top_entropy_quantile)  # [n, T]
        per_token = per_token * kept
    # 5. engine/trainer mismatch: importance weights on the policy term (vespo weighs them itself)
    if engine is not None and not LOSSES[s.loss].own_engine_weights:
        per_token = per_token * engine
    # 6. KL to the reference model (times the importance ratio: TRL's use_bias_correction_kl)
    kl = None
    if s.beta > 0 and ref_logp is not None:
        kl = s.kl(logp, ref_logp.to(device))                        # [n, T]
        if s.kl_importance_correction:
            kl = kl * ratio
        per_token = per_token + s.beta * kl
    if s.distill == "reward_plus_kl" and teacher is not None:  # ... and to the teacher
        per_token = per_token + s.distill_coef * KL_ESTIMATORS[s.distill_kl_estimator].fn(logp, teacher)
    # 7. the named aggregation: a share of the whole batch's loss
    loss = s.aggregation(per_token, mask, norm)
    # 8. entropy bonus: coef x the mean entropy of the step's loss tokens (of the kept ones, filtered)
    if s.entropy_coef > 0:
        loss = loss - s.entropy_coef * (entropy * kept).sum() / max(norm.num_tokens, 1)
    with torch.no_grad():
        none = mask.new_zeros(())
        lengths = mask.sum(-1)                                      # [n]
        counted = lengths > 0  # a sequence with no loss token has no share (TRL: NaN, left out)
        low_share = ((low.float() * mask).sum(-1) / lengths.clamp(min=1.0))[counted]    # [k]
        high_share = ((high.float() * mask).sum(-1) / lengths.clamp(min=1.0))[counted]  # [k]
        stats = torch.stack([                                       # [10] STAT_KEYS, EXTREME_KEYS
            mask.sum(), (kl * mask).sum() if kl is not None else none,
            (entropy * mask).sum() if entropy is not None else none,
            (low.float() * mask).sum(), (high.float() * mask).sum(), ((low | high).float() * mask).sum(),
            loss.detach().to(mask.dtype), teacher_gap.sum() if teacher_gap is not None else none,
            low_share.min() if len(low_share) else none + math.inf,
            high_share.max() if len(high_share) else none - math.inf,
        ]).double()
    return loss, stats


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


class Sums:
    """A step's figures over its micro-batches: STAT_KEYS summed, EXTREME_KEYS' least low and largest high."""

    def __init__(self, device: torch.device, idle: bool) -> None:
        self.totals = torch.zeros(len(STAT_KEYS), dtype=torch.float64, device=device)  # [8] STAT_KEYS
        # [2] low_min, -high_max: the least of each (idle rows: advantage 0, no clipped token: share 0)
        self.least = torch.tensor([0.0 if idle else math.inf, math.inf], dtype=torch.float64, device=device)
        self.flip = torch.tensor([1.0, -1.0], dtype=torch.float64, device=device)  # (low_min, high_max) -> least

    def add(self, stats: torch.Tensor) -> None:
        """One micro-batch's `[10]` figures (micro_batch_loss)."""
        self.totals += stats[: len(STAT_KEYS)]
        self.least = torch.minimum(self.least, stats[len(STAT_KEYS):] * self.flip)


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
