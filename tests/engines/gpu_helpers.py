"""Helpers of the CUDA tests in tests/engines (test_vllm_gpu.py, test_vllm_gpu2.py): tiny policies on a
GPU, how far an engine's log-probs are from a policy's, and a `grpo vllm-serve` (run_server) beside
the trainer with a small share of the GPU (the command line's --gpu-memory-utilization is 0.9)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

#: `grpo vllm-serve` (run_server) beside a trainer on one GPU: a quarter of it, eager (a fast start).
SERVE = ("import sys; from grpocli.server.app import run_server; run_server(model=sys.argv[1], port=int(sys.argv[2]), "
         "dtype=sys.argv[3], max_model_len=256, gpu_memory_utilization=0.25, enforce_eager=True)")


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


def wait_for(url: str, proc, log, timeout: float = 110.0) -> None:
    """Until the server answers /health; its log's tail in the error where it exits or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"grpo vllm-serve exited ({proc.returncode}):\n{Path(log).read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"grpo vllm-serve did not answer within {timeout} s:\n{Path(log).read_text()[-3000:]}")


def stop(url: str, proc) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(url + "/close", data=b"{}", method="POST",
                                                      headers={"Content-Type": "application/json"}), timeout=10)
        proc.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(timeout=30)


def server_backend(url: str, model, tokenizer):
    from grpocli.generation.vllm_client import VllmServerBackend

    r = recipe("generation.backend='vllm-server'", f"vllm.server_url='{url}'", "vllm.server_timeout=60")
    return VllmServerBackend(model, tokenizer, vllm_section=r.vllm, max_prompt_length=64)


@contextmanager
def started_server(model_dir, log_path, *, dtype: str = "float32", env: dict | None = None) -> Iterator[str]:
    """A running `grpo vllm-serve` engine on ``model_dir`` (its URL) in a subprocess; ``env`` is added
    to this process's environment (CUDA_VISIBLE_DEVICES: which GPU)."""
    from vllm_serve_process import free_port

    port = free_port()
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, str(model_dir), str(port), dtype], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url, proc, log_path)
        yield url
    finally:
        stop(url, proc)
