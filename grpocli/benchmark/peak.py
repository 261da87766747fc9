"""The device's matmul peak, measured: square matmuls at the training dtype, timed after a warm-up
(the best rate over a few sizes).

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
    size: int           # n of the n x n matmuls that gave it


def matmul_peak(device: Any, dtype: Any, *, sizes: tuple[int, ...] | None = None, seconds: float = 2.0) -> Peak:
    """The best rate of square matmuls on `device` in `dtype` over a few sizes (default 2048..8192 on
    a GPU, 512..2048 on a CPU), each timed for about `seconds / len(sizes)` after a warm-up."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    sizes = sizes or ((2048, 4096, 8192) if cuda else (512, 1024, 2048))
    best: tuple[float, int] = (0.0, 0)
    for n in sizes:
        rate = _rate(torch, device, dtype, n, seconds / len(sizes))
        best = max(best, (rate, n))
    if cuda:
        name = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        threads = torch.get_num_threads()
        name = f"cpu ({threads} thread{'s' if threads > 1 else ''})"
    return Peak(best[0], name, str(dtype).removeprefix("torch."), best[1])


def _rate(torch: Any, device: Any, dtype: Any, n: int, seconds: float) -> float:
    """FLOP/s of `n x n @ n x n`: the best of 4 timed rounds."""
    cuda = device.type == "cuda"
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
    reps = max(1, int(seconds / 4 / max(timed(1), 1e-6)))
    return 2.0 * n**3 / min(timed(reps) / reps for _ in range(4))
