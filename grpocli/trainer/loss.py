"""The loss of one micro-batch: the named objective, KL, distillation, aggregation, and the figures the
step sums (STAT_KEYS, EXTREME_KEYS). Its phases, in TRL 1.16's order (`_compute_loss`): log-probs ->
importance ratio (token or sequence) -> the loss's per-token objective -> high-entropy token filter
-> engine importance weights -> KL -> named aggregation -> entropy bonus. grpocli.trainer.step runs
it for every micro-batch of an optimizer step (grpocli.trainer.split_passes under a sequence split).
"""

from __future__ import annotations

import math
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
from grpocli.trainer.batching import MicroBatch

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
