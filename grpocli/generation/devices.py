"""Which CUDA device a process, a thread or a server works on, and whether two are the same GPU.

CUDA's current device belongs to each thread: a thread starts on GPU 0 whatever its process
chose, so a worker thread that runs the engine or the model (the prefetch thread, a server's
engine thread, a fleet's sender threads) first makes the process's device its own (``use_device``),
as TRL's VLLMClient does before it joins a weight-transfer group (``torch.cuda.set_device``).

Two processes see one GPU under different indices (CUDA_VISIBLE_DEVICES), so ``gpu_identity``
names a GPU by its UUID, which every process sees alike; `grpo vllm-serve` reports its own in
/info, and the trainer compares it with its own before it picks NCCL (``same_gpu``).
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


def gpu_identity(device: Any) -> dict[str, Any]:
    """What /info says about a device: {"type": "cpu"} or {"type": "cuda", "index", "uuid", "name"};
    the UUID is the same in every process that sees the GPU, whatever its index there."""
    cuda = cuda_device(device)
    if cuda is None:
        return {"type": "cpu"}
    props = torch.cuda.get_device_properties(cuda)
    return {"type": "cuda", "index": cuda.index, "uuid": str(getattr(props, "uuid", "")) or None,
            "name": props.name}


def same_gpu(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether two ``gpu_identity`` answers name one GPU: True or False where both are GPUs with a
    UUID; False where either is no GPU; None where it cannot be told (a GPU without a UUID, or a
    server that did not say)."""
    if not a or not b:
        return None
    if a.get("type") != "cuda" or b.get("type") != "cuda":
        return False
    if not a.get("uuid") or not b.get("uuid"):
        return None
    return a["uuid"] == b["uuid"]


__all__ = ["adopt_thread", "cuda_device", "current_cuda_device", "gpu_identity", "process_device", "same_gpu",
           "use_device"]
