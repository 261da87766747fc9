"""Helpers of the CUDA tests in tests/engines (test_vllm_gpu.py, test_vllm_gpu2.py): tiny policies on a
GPU, how far an engine's log-probs are from a policy's, and a `grpo vllm-serve` beside the trainer with a
small share of the GPU (the command line's --gpu-memory-utilization is 0.9)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: `grpo vllm-serve` beside a trainer on one GPU: a quarter of it, eager (a fast start).
SERVE_FLAGS = ("--gpu-memory-utilization", "0.25", "--enforce-eager")


def tiny_model(shape: dict, seed: int, device: str = "cuda:0"):
    """A float32 tiny policy whose distributions depend on the seed (noise on the inner weights)."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModel(**shape), tokenizer, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.to(device), tokenizer


def gap(model, generated, n: int, reference_logprobs) -> float:
    """Mean |engine log-prob - the model's (float32, on the CPU)| over the generated tokens."""
    import copy

    cpu = copy.deepcopy(model).to("cpu")
    diffs = []
    for i, (ids, logp) in enumerate(zip(generated.completion_ids, generated.logprobs, strict=True)):
        want = reference_logprobs(cpu, generated.prompt_ids[i // n], ids)
        diffs += [abs(a - b) for a, b in zip(logp, want, strict=True)]
    return sum(diffs) / len(diffs)


def recipe(*keys: str):
    from grpocli.recipe import load_recipe

    return load_recipe(None, list(keys)).recipe


def server_backend(url: str, model, tokenizer):
    from grpocli.generation.vllm_client import VllmServerBackend

    r = recipe("generation.backend='vllm-server'", f"vllm.server_url='{url}'", "vllm.server_timeout=60")
    return VllmServerBackend(model, tokenizer, vllm_section=r.vllm, max_prompt_length=64)


@contextmanager
def started_server(model_dir, log_path, *, dtype: str = "float32", env: dict | None = None,
                   args: tuple[str, ...] = ()) -> Iterator[str]:
    """A running `grpo vllm-serve` on ``model_dir`` (its URL) in a subprocess; ``env`` is added to this
    process's environment (CUDA_VISIBLE_DEVICES: which GPU); ``args``: more flags."""
    from vllm_serve_process import Server

    server = Server(model_dir, log_path, api_key=None, env=env, args=("--dtype", dtype, *SERVE_FLAGS, *args))
    try:
        server.wait(timeout=300)
        yield server.url
    finally:
        server.stop()
