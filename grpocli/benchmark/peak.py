"""The device's matmul peak, measured: square matmuls at the training dtype, timed after a warm-up.

MFU in `grpo bench` is the step's achieved FLOP/s over this figure, so it says how close the step
comes to what this device does on this machine now (its clocks, its thread count, its load), not
to a datasheet number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Peak:
    flops_per_s: float  # measured
    device: str         # "cuda: NVIDIA H100 ..." or "cpu (1 thread)"
    dtype: str          # "bfloat16", "float32", ...
    size: int           # n of the n x n matmuls


def matmul_peak(device: Any, dtype: Any, *, size: int | None = None, seconds: float = 1.0) -> Peak:
    """The best of several timed rounds of `n x n @ n x n` on `device` in `dtype` (about `seconds` in all)."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    n = size or (8192 if cuda else 1024)
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)

    def timed(reps: int) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    timed(1)  # warm-up: kernels chosen, caches filled
    per = max(timed(1), 1e-6)
    reps = max(1, int(seconds / 4 / per))
    best = min(timed(reps) / reps for _ in range(4))
    if cuda:
        name = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        name = f"cpu ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"
    return Peak(2.0 * n**3 / best, name, str(dtype).removeprefix("torch."), n)
