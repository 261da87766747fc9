"""What the training loop tells an observer about each optimizer step (`grpo bench` is one).

An observer is given to the loop (`Loop(s, observer=...)`) and called once per optimizer step,
after the step's metrics are recorded (phase 8), with an immutable `StepRecord`: the step's
phase seconds as metrics.jsonl has them, its wall time, and the token counts of the groups each
pass ran over (no token ids). It reads the record and changes nothing: the loop's metrics are the
same with an observer or without one, and the observer's own time is not counted in the next
step's. The record is built only when an observer is given.

A generation cycle's once-per-cycle work (generation, rewards, the frozen log-prob passes) is in
every step of the cycle: `cycle_steps` says how many steps share it, as metrics.jsonl shares its
time. The lengths are this process's (its share of the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from grpocli.trainer.rollouts import Batch, Rollouts, Slice


@dataclass(frozen=True)
class Lengths:
    """The token counts of a batch of groups: what FLOPs and throughput need."""

    prompts: tuple[int, ...]               # [B] each group's prompt tokens
    completions: tuple[int, ...]           # [B*G] each rollout's completion tokens, prompt-major
    keep: tuple[bool, ...] | None = None   # [B*G] the rollouts that enter the loss (None: all)

    @classmethod
    def of(cls, rollouts: Rollouts, keep: torch.Tensor | None = None, *, model_only: bool = False) -> Lengths:
        """`rollouts`' lengths; `model_only`: the tokens the model wrote (a multi-turn rollout's without
        its tool turns), else every completion token."""
        lengths = rollouts.model_lengths() if model_only else rollouts.completion_lengths()  # [B*G]
        return cls(prompts=tuple(len(p) for p in rollouts.prompt_ids),
                   completions=tuple(int(n) for n in lengths.tolist()),
                   keep=None if keep is None else tuple(bool(k) for k in keep.tolist()))


@dataclass(frozen=True)
class FrozenPasses:
    """The frozen log-prob passes over one optimizer batch of the cycle (phase 5)."""

    lengths: Lengths    # its groups; keep: the rollouts in the loss (the passes run over those)
    passes: int         # forward passes this process ran over them: old policy, in-process reference (0-2)


@dataclass(frozen=True)
class Overlap:
    """Generation beside training (generation.async_steps, or pipeline "inflight"): how they overlapped
    over the step's cycle."""

    waited: float             # seconds the trainer waited for the cycle's generation batch
    engine_idle: float        # seconds the engine had nothing to generate since the previous cycle took its batch
    staleness_mean: float     # over the cycle's tokens: the trainer's version minus the one that sampled the token
    staleness_max: float      # (async_steps: the whole batch's, as generation/staleness)
    groups_in_flight: int     # in flight: groups submitted and not yet trained, after the cycle took its own

    @classmethod
    def of(cls, info: dict[str, float], waited: float) -> Overlap | None:
        """From a batch's info (grpocli.trainer.pipeline, grpocli.trainer.prefetch); None where generation
        ran in the step (the engine idle all the rest of it)."""
        if "generation/engine_idle" not in info:
            return None
        batch = info.get("generation/staleness", 0.0)
        return cls(waited, info["generation/engine_idle"], info.get("generation/staleness/mean", batch),
                   info.get("generation/staleness/max", batch), int(info.get("generation/groups_in_flight", 0)))


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step, as the loop took it."""

    step: int                          # the step just taken (1-based, as metrics.jsonl)
    seconds: dict[str, float]          # its phases, metrics.jsonl's keys: time/generation, time/rewards,
                                       # time/logprobs (the cycle's, in equal shares), time/weight_sync, time/training
    wall: float                        # seconds since the previous step was recorded (the first: since the loop began)
    completion_tokens: float           # generated, all processes: the step's share of the cycle's (the model's own)
    cycle_steps: int                   # optimizer steps the cycle's generation and frozen passes are shared by
    generated: Lengths                 # the cycle's generation batch; completions: the model's own tokens
    frozen: tuple[FrozenPasses, ...]   # [steps_per_generation] the cycle's frozen log-prob passes
    trained: Lengths                   # the step's optimizer batch; keep: the rollouts in its loss
    skipped: bool                      # the update was skipped (no row computed, or a non-finite gradient)
    overlap: Overlap | None = None     # generation.pipeline = "inflight": the cycle's waits and staleness

    @classmethod
    def of(cls, step: int, batch: Batch, slices: list[Slice], sl: Slice, *, skipped: bool, seconds: dict[str, float],
           wall: float, completion_tokens: float, cycle_steps: int) -> StepRecord:
        """The record of the step the loop just took on `sl`, one of the cycle's `slices` of `batch`."""
        return cls(
            step=step, seconds=dict(seconds), wall=wall, completion_tokens=completion_tokens, cycle_steps=cycle_steps,
            generated=Lengths.of(batch.scored.rollouts, model_only=True),
            frozen=tuple(FrozenPasses(Lengths.of(x.scored.rollouts, x.advantages.keep), x.passes) for x in slices),
            trained=Lengths.of(sl.scored.rollouts, sl.advantages.keep), skipped=skipped,
            overlap=Overlap.of(batch.info, batch.seconds["time/generation"]))

    @property
    def other(self) -> float:
        """The wall time outside the phases: advantages, batching, metrics, rollouts files (0 at least)."""
        return max(self.wall - sum(self.seconds.values()), 0.0)


class StepObserver(Protocol):
    def on_step(self, record: StepRecord) -> None:
        """Called on every process after each optimizer step's metrics are recorded."""
        ...


__all__ = ["FrozenPasses", "Lengths", "Overlap", "StepObserver", "StepRecord"]
