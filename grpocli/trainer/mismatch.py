"""Engine log-probs into the loss: importance weights (TRL's four modes, OpenRLHF's gates) and their metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpocli.algorithms.importance import mismatch_sums
from grpocli.algorithms.variants import IMPORTANCE_SAMPLING_MODES
from grpocli.parallel import Parallel
from grpocli.trainer.batching import MicroBatch
from grpocli.trainer.rollouts import Rollouts

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection


def importance_weights(rollouts: Rollouts, micro_batches: tuple[MicroBatch, ...], old_logp: tuple[torch.Tensor, ...],
                       vllm: VllmSection) -> tuple[tuple[torch.Tensor, ...], dict[str, float]]:
    """The engine importance weight of each micro-batch's tokens, and the mismatch sums over them.

    A weight is `IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]` of the policy's old
    log-probs (`old_logp`, one `[n, T]` per micro-batch) against the engine's, bounded by
    `importance_sampling_clip_min/max`: `[n, T]` times the loss mask for the per-token modes,
    `[n, 1]` (one weight per sequence, broadcast over its tokens; 0 for a sequence with no loss
    token) for the per-sequence ones. The sums are of the raw ratio (`mismatch_metrics`).
    """
    mode = IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]
    weigh, lo, hi = mode.fn, vllm.importance_sampling_clip_min, vllm.importance_sampling_clip_max
    extra = {"divergence_max": vllm.importance_sampling_divergence_max} if mode.gates_divergence else {}
    total = {"tokens": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "ratio_sum": 0.0,
             "ratio_min": float("inf"), "ratio_max": 0.0}
    weights = []
    for mb, old in zip(micro_batches, (lp.cpu() for lp in old_logp), strict=True):
        engine = torch.zeros_like(mb.loss_mask)  # [n, T] completion token t in column t
        for row, i in enumerate(mb.index.tolist()):
            values = rollouts.engine_logprobs[i][: engine.shape[1]]
            engine[row, : len(values)] = torch.tensor(values, dtype=engine.dtype)
        w = weigh(old, engine, mb.loss_mask, lo, hi, **extra)  # [n, T] or [n, 1]
        has_loss = (mb.loss_mask.sum(-1, keepdim=True) > 0).to(w.dtype) if mode.per_sequence else mb.loss_mask
        weights.append(w * has_loss)
        sums = mismatch_sums(old, engine, mb.loss_mask)
        for key in ("tokens", "gap_sum", "ratio_sum"):
            total[key] += sums[key]
        total["gap_max"] = max(total["gap_max"], sums["gap_max"])
        total["ratio_min"] = min(total["ratio_min"], sums["ratio_min"])
        total["ratio_max"] = max(total["ratio_max"], sums["ratio_max"])
    return tuple(weights), total


def mismatch_metrics(parallel: Parallel, sums: dict[str, float]) -> dict[str, float]:
    """TRL's sampling/* metrics over every process ({} where no token was weighed)."""
    local = torch.tensor([sums["tokens"], sums["gap_sum"], sums["gap_max"], sums["ratio_sum"], sums["ratio_min"],
                          sums["ratio_max"]], dtype=torch.float64)
    every = parallel.gather(local).view(-1, 6)  # [W, 6]
    tokens = float(every[:, 0].sum())
    if tokens == 0:
        return {}
    return {
        "sampling/sampling_logp_difference/mean": float(every[:, 1].sum()) / tokens,
        "sampling/sampling_logp_difference/max": float(every[:, 2].max()),
        "sampling/importance_sampling_ratio/mean": float(every[:, 3].sum()) / tokens,
        "sampling/importance_sampling_ratio/min": float(every[:, 4].min()),
        "sampling/importance_sampling_ratio/max": float(every[:, 5].max()),
    }
