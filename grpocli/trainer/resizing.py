"""Surviving an out-of-memory: the micro-batch sizes the steps use now, halved when a pass runs out.

A training pass that runs out of memory (a CUDA allocation, or past train.memory_limit:
grpocli.trainer.memory_budget) leaves the step with no update made and its gradients cleared
(grpocli.trainer.step); `Resizing.step` then halves train.micro_batch_size (or the token budget
train.max_tokens_per_micro_batch), cuts the same sequences into the smaller micro-batches, puts
their frozen log-probs in the new shapes and redoes the step. A log-prob pass that runs out halves
the passes' sequences (train.logprob_micro_batch_size). The smaller size stays for the rest of the
run; each split is said in one line and counted (`memory/oom_splits`). Every loss but a
per-micro-batch one (bnpo) divides by whole-batch counts, so the redone step equals the unsplit one
within float tolerance; past one sequence a micro-batch it stops with exit 2, naming the step, the
sequence length and what to turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from grpocli.algorithms.packing import Layout
from grpocli.algorithms.variants import LOSSES
from grpocli.errors import UserError
from grpocli.parallel import Parallel
from grpocli.trainer.batching import MicroBatch, logprob_chunks, make_micro_batches, regroup
from grpocli.trainer.memory_budget import MemoryBudget, OutOfMemory, gib
from grpocli.trainer.step import Frozen

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe
    from grpocli.recipe.train_section import TrainSection
    from grpocli.trainer.rollouts import Rollouts, Slice

T = TypeVar("T")

#: What lowers a pass's memory once a micro-batch holds one sequence.
AT_THE_FLOOR = ("model.gradient_checkpointing = true, train.activation_offloading = true, a lower "
                "generation.max_completion_length, train.sharding = \"fsdp2\" over more devices, or a higher "
                "train.memory_limit")


@dataclass
class Resizing:
    """The sizes in use (`train`: the recipe's [train] with micro_batch_size, max_tokens_per_micro_batch and
    logprob_micro_batch_size as they are now), the memory budget every pass is checked against, and
    `note(text)` for the one line a split prints."""

    train: TrainSection
    budget: MemoryBudget
    parallel: Parallel
    loss: str
    note: Callable[[str], None]
    splits: int = field(default=0, init=False)  # in the step being taken (memory/oom_splits)

    @classmethod
    def of(cls, recipe: Recipe, parallel: Parallel, note: Callable[[str], None]) -> Resizing:
        limit = recipe.train.memory_limit
        return cls(recipe.train, MemoryBudget(int(limit) if limit is not None else None, parallel.device), parallel,
                   recipe.algorithm.loss, note)

    # -- the frozen log-prob passes ---------------------------------------------------------
    def chunks(self, rollouts: Rollouts, micro_batches: tuple[MicroBatch, ...],
               layout: Layout) -> tuple[MicroBatch, ...] | None:
        """The log-prob passes of these micro-batches at the size in use (`logprob_chunks`)."""
        t = self.train
        return logprob_chunks(rollouts, micro_batches, max_sequences=t.logprob_micro_batch_size,
                              packed=t.max_tokens_per_micro_batch is not None, layout=layout)

    def frozen(self, run: Callable[[tuple[MicroBatch, ...] | None], T], rollouts: Rollouts,
               micro_batches: tuple[MicroBatch, ...], layout: Layout, step: int) -> T:
        """`run(chunks)` (the frozen passes), with fewer sequences a pass after each out-of-memory."""
        while True:
            chunks = self.chunks(rollouts, micro_batches, layout)
            try:
                return run(chunks)
            except OutOfMemory as exc:
                failed = exc
            passes = chunks if chunks is not None else micro_batches
            now = -self.parallel.fewest(-max((mb.num_sequences for mb in passes), default=1))  # the most, everywhere
            if now <= 1:
                raise _at_floor(failed, step, self.budget)
            self._resize(failed, step, "train.logprob_micro_batch_size", now, now // 2)

    # -- the training passes -----------------------------------------------------------------
    def step(self, run: Callable[[Slice], T], sl: Slice, layout: Layout, step: int) -> T:
        """`run(slice)` (one optimizer step) on the slice cut at the size in use, its micro-batches split after
        each out-of-memory and the step redone."""
        sl = self.fitted(sl, layout)
        while True:
            try:
                return run(sl)
            except OutOfMemory as exc:
                failed = exc
            self._smaller_training(failed, step)
            sl = self.fitted(sl, layout)

    def fitted(self, sl: Slice, layout: Layout) -> Slice:
        """The slice cut into micro-batches of the size in use (itself when they already are)."""
        t, mbs = self.train, sl.batch.micro_batches
        if t.max_tokens_per_micro_batch is None:
            fits = all(mb.num_sequences <= t.micro_batch_size for mb in mbs)
        else:
            fits = all(mb.num_sequences == 1 or mb.sequence_tokens <= t.max_tokens_per_micro_batch for mb in mbs)
        if fits:
            return sl
        rows = [i for mb in mbs for i in mb.index.tolist()]
        cut = tuple(make_micro_batches(sl.scored.rollouts, sl.advantages.values, rows, max_sequences=t.micro_batch_size,
                                       max_tokens=t.max_tokens_per_micro_batch, layout=layout))
        frozen = Frozen(*(None if part is None else recut(part, mbs, cut) for part in sl.frozen.parts()))
        return replace(sl, batch=replace(sl.batch, micro_batches=cut), frozen=frozen)

    def _smaller_training(self, failed: OutOfMemory, step: int) -> None:
        t, p = self.train, self.parallel
        if LOSSES[self.loss].per_micro_batch:
            raise UserError(
                f"step {step}: {failed}; algorithm.loss = {self.loss!r} divides by each micro-batch's own tokens, "
                "so a smaller micro-batch would change the loss, and grpo does not split it",
                where="train.micro_batch_size", valid="a size whose step fits",
                hint=f"set a lower train.micro_batch_size (now {t.micro_batch_size}), or a loss that divides by the "
                "whole batch (dapo, grpo, dr_grpo)")
        if p.sharding.startswith("zero"):
            raise UserError(f"step {step}: {failed}, under DeepSpeed, whose engine accumulates the micro-batches "
                            "itself: grpo does not split them there", where="train.micro_batch_size",
                            hint="set a lower train.micro_batch_size (or the token budget) and resume")
        if t.max_tokens_per_micro_batch is None:
            now = min(t.micro_batch_size, failed.sequences or t.micro_batch_size)
            now = -p.fewest(-now)  # the largest any process failed at: every process cuts the same
            if now <= 1:
                raise _at_floor(failed, step, self.budget)
            self._resize(failed, step, "train.micro_batch_size", t.micro_batch_size, now // 2)
        else:
            single = failed.sequences == 1
            if (p.any_process(single) if p.size > 1 else single) or t.max_tokens_per_micro_batch // 2 < 16:
                raise _at_floor(failed, step, self.budget)
            now = t.max_tokens_per_micro_batch
            self._resize(failed, step, "train.max_tokens_per_micro_batch", now, now // 2)

    def _resize(self, failed: OutOfMemory, step: int, key: str, old: int, new: int) -> None:
        self.train = self.train.model_copy(update={key.split(".", 1)[1]: new})
        self.splits += 1
        if self.budget.cuda:
            torch.cuda.empty_cache()  # what the failed pass held, back to the device
        if self.parallel.main:
            self.note(f"step {step}: {failed}: {key} {old} -> {new}, the step redone from its start")

    def metrics(self) -> dict[str, Any]:
        """`memory/oom_splits` of the step just taken, and its peak as the budget saw it (bytes), then start
        the next step's count."""
        out: dict[str, Any] = {"memory/oom_splits": self.splits}
        peak = self.budget.clear_step()
        if peak:
            out["memory/peak"] = peak
        self.splits = 0
        return out


def recut(values: tuple[torch.Tensor, ...], old: tuple[MicroBatch, ...],
          new: tuple[MicroBatch, ...]) -> tuple[torch.Tensor, ...]:
    """Per-sequence values of the old micro-batches (`[n, T]` or, per sequence, `[n, 1]`) in the new ones' shapes."""
    dense = regroup(values, old, new)                                   # [n, T] each
    per_sequence = bool(values) and values[0].shape[1] == 1 and old[0].loss_mask.shape[1] != 1
    return tuple(d[:, :1] for d in dense) if per_sequence else dense   # [n, 1] each: a sequence's one weight


def _at_floor(failed: OutOfMemory, step: int, budget: MemoryBudget) -> UserError:
    limit = f" (train.memory_limit {gib(budget.limit)})" if budget.limit is not None else ""
    return UserError(
        f"step {step}: {failed}, with one sequence a micro-batch already: a {failed.longest}-token sequence does "
        f"not fit{limit}", where="train.micro_batch_size",
        valid="a sequence length whose forward and backward fit the memory",
        hint=f"set {AT_THE_FLOOR}; `grpo plan RECIPE` shows what each saves")


__all__ = ["Resizing", "recut"]
