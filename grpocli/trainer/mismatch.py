"""Engine log-probs into the loss: importance weights (TRL's four modes) and their metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpocli.algorithms import IMPORTANCE_SAMPLING_MODES, mismatch_sums
from grpocli.trainer.batching import MicroBatch
from grpocli.trainer.rollouts import Rollouts

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection


def importance_weights(part: Rollouts, batches: list[MicroBatch], vllm: VllmSection) -> dict[str, float]:
    """Set `is_weight` on every micro-batch (old_logp must be filled); return the mismatch sums.

    `is_weight` is `IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]` of the engine's
    log-probs, bounded by `importance_sampling_clip_min/max`: `[n, T]` times the loss mask for the
    `token_*` modes, `[n, 1]` (one weight per sequence, broadcast over its tokens; 0 for a
    sequence with no loss token) for the `sequence_*` modes. The metrics are of the raw ratio.
    """
    weigh = IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]
    lo, hi = vllm.importance_sampling_clip_min, vllm.importance_sampling_clip_max
    per_sequence = vllm.importance_sampling_mode.startswith("sequence_")
    total = {"tokens": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "ratio_sum": 0.0,
             "ratio_min": float("inf"), "ratio_max": 0.0}
    for mb in batches:
        engine = torch.zeros_like(mb.loss_mask)  # [n, T] completion token t in column t
        for row, i in enumerate(mb.index.tolist()):
            values = part.engine_logprobs[i][: engine.shape[1]]
            engine[row, : len(values)] = torch.tensor(values, dtype=engine.dtype)
        weights = weigh(mb.old_logp, engine, mb.loss_mask, lo, hi)  # [n, T] or [n, 1]
        has_loss = (mb.loss_mask.sum(-1, keepdim=True) > 0).to(weights.dtype) if per_sequence else mb.loss_mask
        mb.is_weight = weights * has_loss
        sums = mismatch_sums(mb.old_logp, engine, mb.loss_mask)
        for key in ("tokens", "gap_sum", "ratio_sum"):
            total[key] += sums[key]
        total["gap_max"] = max(total["gap_max"], sums["gap_max"])
        total["ratio_min"], total["ratio_max"] = min(total["ratio_min"], sums["ratio_min"]), max(total["ratio_max"], sums["ratio_max"])
    return total


def mismatch_metrics(accelerator: Any, sums: list[dict[str, float]]) -> dict[str, float]:
    """TRL's sampling/* metrics over every process."""
    local = torch.tensor([[sum(x["tokens"] for x in sums), sum(x["gap_sum"] for x in sums),
                           max(x["gap_max"] for x in sums), sum(x["ratio_sum"] for x in sums),
                           min(x["ratio_min"] for x in sums), max(x["ratio_max"] for x in sums)]],
                         dtype=torch.float64, device=accelerator.device)
    every = accelerator.gather(local).cpu()  # [W, 6]
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
