"""Every algorithm option trains for real (tiny model, a few steps) and logs TRL's metric names."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from tiny_runs import FAST

from grpocli.recipe import load_recipe
from grpocli.trainer.loop import train

TRL_METRICS = {
    "reward", "reward_std", "rewards/length/mean", "rewards/length/std", "kl", "entropy",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max", "completions/mean_length", "completions/min_length", "completions/max_length",
    "completions/clipped_ratio", "completions/mean_terminated_length", "completions/min_terminated_length",
    "completions/max_terminated_length", "step_time", "frac_reward_zero_std",
    "num_tokens", "grad_norm", "learning_rate", "real_batch_size_ratio", "time/generation",
    "time/rewards", "time/logprobs", "time/training", "time/weight_sync", "tokens_per_second",
}


def run(tmp_path, *overrides: str) -> list[dict]:
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}", *overrides]))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_metrics_rollouts_and_checkpoint(tmp_path):
    metrics = run(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert TRL_METRICS <= set(metrics[-1]), TRL_METRICS - set(metrics[-1])
    assert metrics[-1]["num_tokens"] > metrics[0]["num_tokens"] > 0
    rollout = json.loads((tmp_path / "run/rollouts/step-2.jsonl").read_text().splitlines()[0])
    assert {"prompt", "completion", "rewards", "advantage", "reward"} <= set(rollout)
    ckpt = tmp_path / "run/checkpoints/step-2"
    assert (ckpt / "config.json").exists() and (ckpt / "trainer/state.json").exists()
    assert (tmp_path / "run/config.resolved.toml").exists()


class Counted:
    """A variant's table entry whose functions count their calls under the entry's name."""

    def __init__(self, entry, name: str, counters: dict[str, Counter], keys: dict[str, str]) -> None:
        self._entry, self._name, self._counters, self._keys = entry, name, counters, keys

    def __getattr__(self, attr: str):
        value = getattr(self._entry, attr)
        if attr not in self._keys:
            return value

        def counted(*args, **kwargs):
            self._counters[self._keys[attr]][self._name] += 1
            return value(*args, **kwargs)

        return counted


@pytest.fixture
def table_calls(monkeypatch):
    """Every entry of LOSSES (objective and aggregation), ADVANTAGES and KL_ESTIMATORS wrapped to count
    the calls of its functions by the entry's name."""
    from grpocli.algorithms.variants import ADVANTAGES, KL_ESTIMATORS, LOSSES

    calls: dict[str, Counter] = {"loss": Counter(), "surrogate": Counter(), "advantage_scale": Counter(),
                                 "kl_estimator": Counter()}
    for table, keys in ((LOSSES, {"objective_fn": "surrogate", "aggregation_fn": "loss"}),
                        (ADVANTAGES, {"fn": "advantage_scale"}), (KL_ESTIMATORS, {"fn": "kl_estimator"})):
        for name, entry in list(table.items()):
            monkeypatch.setitem(table, name, Counted(entry, name, calls, keys))
    return calls


@pytest.mark.parametrize("overrides", [
    ["algorithm.loss=grpo"], ["algorithm.loss=bnpo"], ["algorithm.loss=dr_grpo", "algorithm.advantage_scale=none"],
    ["algorithm.loss=seq-mean-token-sum-norm"],  # verl's name for dr_grpo
    ["algorithm.advantage_scale=batch"],
    ["algorithm.advantage_scale=centered"], ["algorithm.advantage_scale=rloo"],
    ["algorithm.advantage_scale=reinforce_pp"],
    # GDPO with two rewards (the second a "length#2" label) and the overlong penalty as a third part
    ["algorithm.advantage_scale=normalize_then_sum", "algorithm.overlong_penalty={buffer_length=4}",
     'rewards=[{name="length", args={target=8}}, {name="length", args={target=2}, weight=0.5}]'],
    ["algorithm.beta=0.1", "algorithm.kl_estimator=k1", "algorithm.ref_sync_steps=1", "algorithm.ref_sync_alpha=0.5"],
    ["algorithm.beta=0.1", "algorithm.kl_estimator=k2"], ["algorithm.beta=0.1", "algorithm.kl_estimator=abs"],
    ["algorithm.loss=cispo", "algorithm.epsilon_high=5.0"], ["algorithm.loss=sapo"], ["algorithm.loss=vespo"],
    ["algorithm.loss=luspo", "algorithm.importance_sampling_level=sequence"],
    ["algorithm.importance_sampling_level=sequence", "algorithm.loss=grpo", "algorithm.num_iterations=2",
     "train.steps=4"],  # GSPO
    ["algorithm.delta=1.5", "algorithm.clip_ratio_c=3.0", "algorithm.num_iterations=2", "train.steps=4"],
    ["algorithm.entropy_coef=0.01", "algorithm.top_entropy_quantile=0.2"],
    ["algorithm.beta=0.05", "algorithm.kl_estimator=low_var_kl", "algorithm.kl_importance_correction=true"],
    ["algorithm.drop_zero_spread_groups=false", "algorithm.token_normalizer=generation_batch",
     "train.steps_per_generation=2", "train.steps=4", "algorithm.mask_truncated_completions=true",
     "algorithm.truncated_rows=count"],  # TRL's conventions
    ["algorithm.num_iterations=2", "train.steps=4"],
    ["train.steps_per_generation=2", "train.steps=4"],
    ["algorithm.mask_truncated_completions=true", "algorithm.overlong_penalty={buffer_length=4}"],
    ["algorithm.fill_batch=true", "algorithm.max_fill_rounds=2"],
    ["train.max_tokens_per_micro_batch=64"],
    ["train.lr_scheduler=cosine", "train.warmup_steps=1", "train.max_grad_norm=0.5"],
    ["model.gradient_checkpointing=true"],
    ["model.lora={enabled=true, r=4, alpha=8}"],
], ids=lambda o: " ".join(o))
def test_variant_trains(tmp_path, overrides, table_calls):
    """Each option trains, and the variants used are exactly the ones the recipe names."""
    metrics = run(tmp_path, *overrides)
    steps = next((int(o.split("=")[1]) for o in overrides if o.startswith("train.steps=")), 2)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for m in metrics:
        assert math.isfinite(m["reward"]) and m["grad_norm"] is not None
    algorithm = load_recipe("quickstart", list(overrides)).recipe.algorithm
    assert set(table_calls["loss"]) == {algorithm.loss}, table_calls["loss"]
    assert set(table_calls["surrogate"]) == {algorithm.loss}, table_calls["surrogate"]
    assert set(table_calls["advantage_scale"]) == {algorithm.advantage_scale}, table_calls["advantage_scale"]
    assert set(table_calls["kl_estimator"]) == ({algorithm.kl_estimator} if algorithm.beta > 0 else set())
    if algorithm.beta > 0:
        assert metrics[-1]["kl"] != 0.0  # the reference was really used (and refreshed)
    if "algorithm.num_iterations=2" in overrides:
        # the second update of a batch sees a ratio != 1: the old log-probs were kept
        assert any(m.get("clip_ratio/region_mean", 0) > 0 or m["loss"] != 0 for m in metrics)


def test_live_warning_and_evaluation_during_training(tmp_path, capfd):
    from grpocli.inspection.alerts import NO_SIGNAL_STEPS

    # format.strict never fires for an untrained tiny model: every group is flat, no signal
    metrics = run(tmp_path, 'rewards=[{name="format.strict"}]', f"train.steps={NO_SIGNAL_STEPS + 1}",
                  "eval.every=2", "eval.num_prompts=2", "eval.n=2", "eval.k=[1, 2]")
    assert "no learning signal" in capfd.readouterr().err
    evals = [m for m in metrics if "eval/reward" in m]
    assert [m["step"] for m in evals] == list(range(2, NO_SIGNAL_STEPS + 2, 2))
    assert all(m["frac_reward_zero_std"] == 1.0 for m in metrics if "frac_reward_zero_std" in m)


