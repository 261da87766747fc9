"""The quickstart learns: reward over the last steps clearly above the first, for other seeds too."""

from __future__ import annotations

import json

import pytest

from grpocli.recipe import load_recipe
from grpocli.trainer.loop import train


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_quickstart_reward_rises_for_other_seeds(tmp_path, seed):
    out = tmp_path / f"seed{seed}"
    train(load_recipe("quickstart", [f"train.seed={seed}", "train.steps=30", f"train.output_dir={out}",
                                     "log.progress=none", "log.rollouts_every=0"]))
    rewards = [json.loads(line)["reward"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.5, (first, last, rewards)
