"""vllm.LLM's arguments per device (grpocli.generation.engine_options): pure, no vLLM, no GPU.

The CPU answer is pinned to what grpo passed before the CUDA rules existed; the CUDA answers are
TRL's colocate set-up (external launcher, rank environment, 4096 batched tokens, CUDA graphs).
"""

from __future__ import annotations

import pytest
import torch

from grpocli.generation.engine_options import GPU_BATCHED_TOKENS, eager, engine_dtype, engine_options, launcher_env
from grpocli.recipe import load_recipe

CPU_KEYS = {"model", "dtype", "max_model_len", "seed", "enforce_eager", "gpu_memory_utilization", "logprobs_mode",
            "max_logprobs"}


def test_the_cpu_engine_gets_exactly_what_it_got_before():
    for colocated in (True, False):
        opts = engine_options("/m", None, world=2, rank=1, colocated=colocated, dtype="float32", max_model_len=76,
                              gpu_memory_utilization=0.3, seed=7, environ={})
        assert set(opts.kwargs) == CPU_KEYS
        assert opts.kwargs == {"model": "/m", "dtype": "float32", "max_model_len": 76, "seed": 7,
                               "enforce_eager": True, "gpu_memory_utilization": 0.3,
                               "logprobs_mode": "processed_logprobs", "max_logprobs": 1}
        assert opts.env == {} and opts.device is None


def test_a_colocated_cuda_engine_uses_the_external_launcher_on_its_own_gpu():
    """Process 2 of 4 on cuda:2: vLLM's worker takes LOCAL_RANK as its device (not cuda:0)."""
    opts = engine_options("/m", torch.device("cuda", 2), world=4, rank=2, colocated=True, dtype="bfloat16",
                          seed=9, environ={"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, port=lambda: 1)
    assert opts.kwargs["distributed_executor_backend"] == "external_launcher"
    assert opts.kwargs["enforce_eager"] is False
    assert opts.kwargs["max_num_batched_tokens"] == GPU_BATCHED_TOKENS == 4096
    assert opts.kwargs["seed"] == 9 and opts.kwargs["dtype"] == "bfloat16"
    assert opts.env == {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
                        "MASTER_PORT": "29500"}
    assert opts.device == torch.device("cuda", 2)


def test_local_rank_is_the_device_index_not_the_global_rank():
    """Second node, process 9 of 16 on its machine's cuda:1."""
    env = launcher_env(torch.device("cuda", 1), world=16, rank=9, environ={}, port=lambda: 4242)
    assert env["RANK"] == "9" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "16"
    assert env["MASTER_ADDR"] == "localhost" and env["MASTER_PORT"] == "4242"


@pytest.mark.parametrize("given", ["", "0", "auto"])
def test_a_missing_or_automatic_master_port_gets_a_free_one(given):
    env = launcher_env(torch.device("cuda", 0), world=1, rank=0, environ={"MASTER_PORT": given}, port=lambda: 31337)
    assert env["MASTER_PORT"] == "31337"


def test_a_server_engine_on_cuda_keeps_vllms_own_executor():
    opts = engine_options("/m", torch.device("cuda", 0), colocated=False, environ={})
    assert "distributed_executor_backend" not in opts.kwargs and opts.env == {}
    assert opts.kwargs["enforce_eager"] is False and opts.kwargs["max_num_batched_tokens"] == 4096


def test_what_the_recipe_says_wins_on_any_device():
    gpu = engine_options("/m", torch.device("cuda", 0), enforce_eager=True, max_num_batched_tokens=8192, environ={})
    cpu = engine_options("/m", None, enforce_eager=False, max_num_batched_tokens=2048, environ={})
    assert gpu.kwargs["enforce_eager"] is True and gpu.kwargs["max_num_batched_tokens"] == 8192
    assert cpu.kwargs["enforce_eager"] is False and cpu.kwargs["max_num_batched_tokens"] == 2048


def test_eager_none_means_on_for_cpu_off_for_cuda():
    assert eager(None, cuda=False) is True and eager(None, cuda=True) is False
    assert eager(True, cuda=True) is True and eager(False, cuda=False) is False


@pytest.mark.parametrize(("chosen", "policy", "cuda", "bf16", "engine"), [
    (None, "float32", False, False, "float32"),    # CPU: the policy's, as before
    (None, "auto", False, False, "auto"),
    (None, "float32", True, True, "bfloat16"),     # GPU: fp32 policy -> bf16 engine
    (None, "float32", True, False, "float32"),     # a GPU without bf16 (V100) keeps fp32
    (None, "bfloat16", True, True, "bfloat16"),
    (None, "float16", True, True, "float16"),
    ("float32", "float32", True, True, "float32"),  # vllm.dtype wins
    ("auto", "float32", True, True, "auto"),
    ("bfloat16", "float32", False, False, "bfloat16"),
])
def test_engine_dtype(chosen, policy, cuda, bf16, engine):
    assert engine_dtype(chosen, policy, cuda=cuda, bf16=bf16) == engine


def test_the_recipe_keys_and_their_defaults():
    v = load_recipe(None, []).recipe.vllm
    assert v.enforce_eager is None and v.dtype is None and v.max_num_batched_tokens is None
    assert v.importance_sampling_correction is True  # corrects the bf16 engine against the fp32 trainer
    keys = ["vllm.enforce_eager=true", "vllm.dtype='float32'", "vllm.max_num_batched_tokens=8192"]
    v = load_recipe(None, keys).recipe.vllm
    assert (v.enforce_eager, v.dtype, v.max_num_batched_tokens) == (True, "float32", 8192)
