"""Which CUDA device a process or a thread works on.

CUDA's current device belongs to each thread: a thread starts on GPU 0 whatever its process
chose, so a worker thread that runs the engine or the model (the prefetch thread, the engine
thread, a fleet's sender threads) first makes the process's device its own (``use_device``),
as TRL's VLLMClient does before it joins a weight-transfer group (``torch.cuda.set_device``).
"""

from __future__ import annotations

from typing import Any

import torch


def cuda_device(device: Any) -> torch.device | None:
    """``device`` as an indexed CUDA device ("cuda" alone: this thread's current one); None for
    anything else (CPU, None)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def current_cuda_device() -> torch.device | None:
    """The calling thread's current CUDA device, or None where CUDA is not in use yet (nothing
    is initialised by asking)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return torch.device("cuda", torch.cuda.current_device())


def process_device(*candidates: Any) -> torch.device | None:
    """The first CUDA device among ``candidates`` (the strategy's device, the policy's), else the
    calling thread's current CUDA device; None on a CPU-only run."""
    for candidate in candidates:
        found = cuda_device(candidate)
        if found is not None:
            return found
    return current_cuda_device()


def use_device(device: Any) -> None:
    """Make ``device`` the calling thread's current CUDA device; nothing for CPU or None. Worker
    threads call it first (as a ThreadPoolExecutor ``initializer``, or at the top of their target)."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def adopt_thread(device: Any, threads: int) -> None:
    """A worker thread that runs the engine or the model takes the process's CUDA device and torch
    (OpenMP) thread count: both belong to the thread that set them, and a new thread starts with the
    defaults (vLLM's CPU attention refuses to run with another count than the engine was built with)."""
    use_device(device)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


__all__ = ["adopt_thread", "cuda_device", "current_cuda_device", "process_device", "use_device"]
