"""The passes of a step under sequence parallelism (train.sequence_parallel = N).

Each process has its own micro-batches; the N processes of a split (grpocli.parallel.sequence) run
every one of them together, slot by slot: for micro-batch slot k, each process's k-th micro-batch
in process order, each process holding 1/N of its rows' tokens. The owner of a micro-batch turns
the gathered log-probs into its loss; the others backward 0 x them, which runs the same
collectives and leaves in their gradients exactly their slice's share of the owner's. Gradients
are reduced (DDP) in the very last backward; under FSDP2 every process runs N passes per slot
(idle ones where a process has no micro-batch), as each pass is a collective of all processes.

A pass out of memory here is not split and redone (grpocli.trainer.resizing): the processes of a
split wait on each other in every layer, so the error stops the run.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from grpocli.algorithms.losses import LossNorm
from grpocli.parallel import Parallel
from grpocli.parallel.strategy import idle_forward, padded
from grpocli.trainer.batching import MicroBatch, OptimizerBatch
from grpocli.trainer.loss import Frozen, LossSettings, Sums, micro_batch_loss
from grpocli.trainer.offloading import ActivationOffloading


def split_plan(parallel: Parallel, items: list[Any]) -> list[tuple[int, int, Any]]:
    """(slot, owner, micro-batch or None: an idle pass) for every pass this process runs, the same
    passes on every process of the split: each slot's micro-batches exchanged within the split."""
    split = parallel.split
    plan = []
    for k, mine in enumerate(padded(items, parallel.device)):  # as many slots on every process
        theirs = split.exchange(mine)                          # [N] each process's k-th micro-batch
        for owner, mb in enumerate(theirs):
            if mb is not None or parallel.forward_collective:
                plan.append((k, owner, mb))
    return plan


def split_training_passes(parallel: Parallel, model: Any, batch: OptimizerBatch, frozen: Frozen,
                          s: LossSettings, norm: LossNorm, offload: ActivationOffloading | None, sums: Sums) -> None:
    """Forward and backward of every micro-batch of the split; this process's own figures into `sums`."""
    split = parallel.split
    plan = split_plan(parallel, list(batch.micro_batches)) or [(0, -1, None)]  # at least one: DDP's reduction
    for n, (k, owner, mb) in enumerate(plan):
        with parallel.accumulating(model, last=n == len(plan) - 1):
            if mb is None:  # a collective every process joins (FSDP2), or DDP's reduction
                parallel.backward(parallel.idle_loss(model))
                continue
            with offload if offload is not None else nullcontext():
                if owner == split.rank:
                    seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []
                    loss, stats = micro_batch_loss(model, mb, frozen.of(k), s, norm, _recording(split, seen))
                    loss = split.tie(loss, *seen[0])
                    sums.add(stats.to(parallel.device))
                else:
                    logp, entropy = split.logprobs(model, mb, s.temperature, with_entropy=True,
                                                   entropy_grad=s.entropy_coef > 0, chunk_tokens=s.chunk_tokens)
                    loss = split.tie(logp.new_zeros(()), logp, entropy)
            parallel.backward(loss)


@torch.no_grad()
def split_logprob_passes(parallel: Parallel, model: Any, passes: list[MicroBatch], temperature: float,
                         chunk_tokens: int) -> list[torch.Tensor]:
    """The log-probs `[n, T]` of this process's `passes`, every process of the split running each."""
    out = []
    for _, owner, mb in split_plan(parallel, passes):
        if mb is None:
            idle_forward(model)
            continue
        logp, _ = parallel.split.logprobs(model, mb, temperature, chunk_tokens=chunk_tokens)
        if owner == parallel.split.rank:
            out.append(logp.detach())
    return out


def _recording(split: Any, seen: list) -> Any:
    """The split's log-prob pass, keeping what it returned (for `tie`)."""
    def forward(model: Any, rows: Any, temperature: float, **kwargs: Any) -> Any:
        out = split.logprobs(model, rows, temperature, **kwargs)
        seen.append(out)
        return out
    return forward

