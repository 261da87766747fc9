"""Engine log-probs into the loss: per-token truncated importance weights and their metrics."""

from __future__ import annotations

from typing import Any

import torch

from grpocli.algorithms import mismatch_sums, truncated_importance_weights
from grpocli.trainer.batching import MicroBatch
from grpocli.trainer.rollouts import Rollouts


def importance_weights(part: Rollouts, batches: list[MicroBatch], cap: float) -> dict[str, float]:
    """Set `is_weight` on every micro-batch (old_logp must be filled); return the mismatch sums."""
    total = {"tokens": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "ratio_sum": 0.0,
             "ratio_min": float("inf"), "ratio_max": 0.0}
    for mb in batches:
        engine = torch.zeros_like(mb.loss_mask)  # [n, T] completion token t in column t
        for row, i in enumerate(mb.index.tolist()):
            values = part.engine_logprobs[i][: engine.shape[1]]
            engine[row, : len(values)] = torch.tensor(values, dtype=engine.dtype)
        mb.is_weight = truncated_importance_weights(mb.old_logp, engine, cap) * mb.loss_mask
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
