"""What the processes exchange: floats gathered in rank order, and one decision taken together."""

from __future__ import annotations

from typing import Any

import torch


def gather_floats(accelerator: Any, values: torch.Tensor) -> torch.Tensor:
    """Concatenate a 1-D float tensor from every process (same length on each), in rank order."""
    return accelerator.gather(values.to(accelerator.device)).cpu()


def fewest(accelerator: Any, count: int) -> int:
    """The smallest ``count`` of any process (so every process takes the same decision)."""
    return int(gather_floats(accelerator, torch.tensor([float(count)])).min())


def total(accelerator: Any, count: float) -> float:
    """``count`` summed over every process."""
    return float(accelerator.reduce(torch.tensor(float(count), dtype=torch.float64, device=accelerator.device),
                                    reduction="sum").item())


def gather_rows(accelerator: Any, rows: list[Any]) -> list[Any]:
    """Every process's list, concatenated in rank order (accelerate's gather_object)."""
    if accelerator.num_processes == 1:
        return rows
    from accelerate.utils import gather_object

    return gather_object(rows)
