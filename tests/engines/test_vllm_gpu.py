"""vLLM on one CUDA GPU: the colocated engine's placement and defaults, and `grpo vllm-serve` on the
trainer's own GPU (NCCL refuses two ranks on one GPU: --weight-transfer grpo_gloo). Skipped without CUDA.

Each test is under 2 minutes on one H100, offline, on the tiny model built from a config. The
CPU halves of these decisions are pinned in tests/generation (engine_options, choose_transport).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]'")
pytestmark = [pytest.mark.vllm, pytest.mark.gpu]

import torch
from gpu_helpers import gap, recipe, server_backend, started_server, tiny_model

from grpocli.generation.base import Sampling

PROMPT_IDS = [[26, 27, 20, 32, 38], [1, 94, 92, 78, 91, 8], [60, 57, 64, 64, 67]]
SAMPLE = Sampling(max_tokens=8, temperature=1.0)


# -- colocated -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def colocated(tiny_shape):
    from grpocli.generation.vllm_colocate import VllmColocateBackend

    torch.cuda.set_device(0)
    model, tokenizer = tiny_model(tiny_shape, seed=1)
    r = recipe("generation.backend='vllm'", "vllm.gpu_memory_utilization=0.3")
    backend = VllmColocateBackend(model, tokenizer, max_prompt_length=64, max_completion_length=16,
                                  vllm_section=r.vllm, dtype="float32", seed=0)
    yield model, backend
    backend.close()
    torch.cuda.empty_cache()


def test_the_colocated_engine_takes_the_cuda_defaults_on_the_trainers_gpu(colocated):
    """bf16 engine for an fp32 policy, CUDA graphs, 4096 batched tokens, the external launcher; the
    weights on cuda:0 and the process still on cuda:0."""
    model, backend = colocated
    config = backend.engine.llm.llm_engine.vllm_config
    assert config.model_config.dtype == torch.bfloat16 and backend.engine.dtype == torch.bfloat16
    assert config.model_config.enforce_eager is False
    assert config.scheduler_config.max_num_batched_tokens == 4096
    assert config.parallel_config.distributed_executor_backend == "external_launcher"
    assert backend.engine.device == torch.device("cuda", 0)
    assert backend.engine.llm.apply_model(lambda m: str(next(m.parameters()).device)) == ["cuda:0"]
    assert torch.cuda.current_device() == 0 and next(model.parameters()).device == torch.device("cuda", 0)


def test_a_sync_reaches_the_engine_and_the_prefetch_thread_generates(colocated, tiny_shape, reference_logprobs):
    """After sync_weights from another policy the engine's log-probs follow it (bf16 tolerance), not
    the one it started from; the generation runs on the prefetch thread (it sets cuda:0 first)."""
    import copy

    from grpocli.trainer.prefetch import Prefetcher

    model, backend = colocated
    before = copy.deepcopy(model)
    other, _ = tiny_model(tiny_shape, seed=2)
    with torch.no_grad():
        for p, q in zip(model.parameters(), other.parameters(), strict=True):
            p.copy_(q)
    backend.sync_weights(model)
    rows = [{"prompt_text": "12+7="}, {"prompt_text": "hello"}]
    pf = Prefetcher(backend, ahead=0, n=2, sampling=SAMPLE)
    try:
        _, generated, _ = pf.next(lambda: rows, step=0)
    finally:
        pf.close()
    assert len(generated.completion_ids) == 4
    now, then = gap(model, generated, 2, reference_logprobs), gap(before, generated, 2, reference_logprobs)
    assert now < 0.1 and now < then / 2, (now, then)


# -- a server on the trainer's GPU ------------------------------------------------------------
@pytest.fixture(scope="module")
def same_gpu_server(tiny_dir, tmp_path_factory):
    """`grpo vllm-serve --weight-transfer grpo_gloo` on this process's GPU (cuda:0 here)."""
    with started_server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log",
                        args=("--weight-transfer", "grpo_gloo")) as url:
        yield url


def test_a_server_on_the_trainers_gpu_gets_the_weights_over_gloo(same_gpu_server, tiny_shape, monkeypatch,
                                                                 reference_logprobs):
    monkeypatch.delenv("GRPO_VLLM_WEIGHT_TRANSPORT", raising=False)
    model, tokenizer = tiny_model(tiny_shape, seed=4)
    backend = server_backend(same_gpu_server, model, tokenizer)
    try:
        assert backend.transport == "gloo"
        assert backend.last_sync["weights_version"] == "1"
        generated = backend.generate_ids(PROMPT_IDS[:2], 2, SAMPLE)
    finally:
        backend.close()
    assert gap(model, generated, 2, reference_logprobs) < 1e-2  # a float32 server holding this policy
