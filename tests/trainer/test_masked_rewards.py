"""A broken grader is not a 0: `[[rewards]] on_error = "mask"` (the default).

The rows a failed reward call could not score are masked: out of their group's mean and std
(hand-computed numbers below), advantage 0, out of the loss; a group left with fewer than 2
scored samples is dropped (and refilled by one more round). A real tiny run with a reward that
raises on some rows trains to its end with them masked; one past `max_masked_share` stops with
exit 2 and the message.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from accelerate import Accelerator
from tiny_runs import FAST

from grpocli.algorithms.advantages import (
    STD_EPS,
    batch_scaled_advantages,
    centered_advantages,
    group_scaled_advantages,
    rloo_advantages,
    zero_spread_groups,
)
from grpocli.parallel import Parallel
from grpocli.recipe import load_recipe
from grpocli.trainer.batching import select_sequences
from grpocli.trainer.refill import refilled, unscorable
from grpocli.trainer.rollouts import Rollouts, Scored, compute_advantages

REWARDS = [[1.0, 2.0, 3.0, 100.0], [0.0, 4.0, 4.0, 5.0]]           # [B=2, G=4]; 100 and the first 4: masked
SCORED = [[True, True, True, False], [True, False, True, True]]


def test_masked_samples_are_out_of_the_group_statistics_and_get_advantage_0():
    rewards, mask = torch.tensor(REWARDS), torch.tensor(SCORED)
    s1 = math.sqrt(7.0)  # group 1's scored rewards 0, 4, 5: mean 3, unbiased std sqrt((9 + 1 + 4) / 2)
    expected = {
        group_scaled_advantages: [[-1 / (1 + STD_EPS), 0, 1 / (1 + STD_EPS), 0],
                                  [-3 / (s1 + STD_EPS), 0, 1 / (s1 + STD_EPS), 2 / (s1 + STD_EPS)]],
        centered_advantages: [[-1, 0, 1, 0], [-3, 0, 1, 2]],
        rloo_advantages: [[1 - 2.5, 0, 3 - 1.5, 0], [0 - 4.5, 0, 4 - 2.5, 5 - 2.0]],  # mean of the other scored
        # the std of every scored reward in the batch, 1 2 3 0 4 5: mean 2.5, sum of squares 17.5 over 5
        batch_scaled_advantages: [[x / (math.sqrt(3.5) + STD_EPS) for x in row] for row in [[-1, 0, 1, 0],
                                                                                             [-3, 0, 1, 2]]],
    }
    for fn, want in expected.items():
        got = fn(rewards, mask=mask)
        assert torch.allclose(got, torch.tensor(want, dtype=torch.float32), atol=1e-6), (fn.__name__, got)
        everyone = torch.ones_like(mask)  # every sample scored: the unmasked formula
        assert torch.allclose(fn(rewards, mask=everyone), fn(rewards), atol=1e-6), fn.__name__
    # a group whose scored rewards are equal has no spread, however far its masked one lies
    assert zero_spread_groups(torch.tensor([[1.0, 1.0, 1.0, 9.0]]), mask=torch.tensor([[True, True, True, False]]))
    assert zero_spread_groups(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), mask=torch.tensor([[True, False, False, False]]))


def _scored(rewards: list[list[float]], masked: list[list[bool]]) -> Scored:
    """Real Rollouts of B prompts x G completions with these totals and masked rows."""
    b, g = len(rewards), len(rewards[0])
    rollouts = Rollouts(rows=[{"prompt": f"p{i}", "prompt_text": f"p{i}"} for i in range(b)],
                        prompt_ids=[[1, 2] for _ in range(b)], completion_ids=[[3, 4, 5]] * (b * g),
                        completions=["abc"] * (b * g), truncated=torch.zeros(b * g, dtype=torch.bool), group_size=g)
    flat = [m for row in masked for m in row]
    return Scored(rollouts, torch.tensor(rewards).reshape(-1), {"r": [None if m else 1.0 for m in flat]},
                  masked_by={"r": flat})


@pytest.mark.parametrize("drop_flat", [True, False])
def test_a_group_with_fewer_than_2_scored_samples_is_dropped_and_refilled(drop_flat):
    recipe = load_recipe("quickstart", ["generation.num_generations=4", "train.prompts_per_step=3",
                                        f"algorithm.drop_zero_spread_groups={str(drop_flat).lower()}"]).recipe
    masked = [[False, False, False, True], [True, True, True, False], [False] * 4]  # group 1: one scored sample
    scored = _scored([[1.0, 2.0, 3.0, 0.0], [5.0, 0.0, 0.0, 7.0], [1.0, 2.0, 2.0, 4.0]], masked)
    adv = compute_advantages(Parallel(Accelerator(cpu=True)), scored, recipe.algorithm, reward_fns=[],
                             max_completion_length=8)
    assert adv.keep.tolist() == [True, True, True, False] + [False] * 4 + [True] * 4
    assert adv.flat.tolist() == [False, True, False]
    assert adv.values.view(3, 4)[1].tolist() == [0.0] * 4 and adv.values[3] == 0.0
    chosen = select_sequences(scored.rollouts, adv, skip_zero_advantage=False)
    assert chosen.computed + chosen.idle == [0, 1, 2, 8, 9, 10, 11]  # neither in the loss nor in its counts
    # one more round: its first group that can be scored takes group 1's place
    extra = _scored([[0.0, 0.0, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]], [[True] * 4, [False, False, True, True]])
    assert unscorable(scored).tolist() == [False, True, False]
    kept = refilled(scored, extra)
    assert kept.rewards.view(3, 4)[1].tolist() == [3.0, 1.0, 0.0, 0.0] and not unscorable(kept).any()
    assert kept.masked.view(3, 4)[1].tolist() == [False, False, True, True]


PICKY = '''
def picky(prompts, completions, completion_ids, **kwargs):
    """Raises on a batch holding a completion whose token ids add up to a multiple of 3."""
    if any(sum(ids) % 3 == 0 for ids in completion_ids):
        raise ValueError("cannot grade this one")
    return [float(len(ids)) for ids in completion_ids]


def down(prompts, completions, **kwargs):
    raise ConnectionError("grader down")
'''


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_reward_that_raises_on_some_rows_masks_them_and_the_run_finishes(tmp_path):
    from grpocli.trainer.loop import train

    (tmp_path / "graders.py").write_text(PICKY)
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}",
                                     f'rewards=[{{name="{tmp_path / "graders.py"}:picky", max_masked_share=1.0}}]']))
    metrics = [m for m in _rows(out / "metrics.jsonl") if "loss" in m]
    assert [m["step"] for m in metrics] == [1, 2]  # it finished
    assert sum(m.get("rewards/picky/masked", 0) for m in metrics) > 0
    assert all(m["rewards/picky/seconds"] >= 0 for m in metrics)
    for step in (1, 2):
        rows = _rows(out / "rollouts" / f"step-{step}.jsonl")
        for row in rows:
            if row.get("masked"):
                assert row["masked"] == ["picky"] and row["rewards"]["picky"] is None
                assert row["advantage"] == 0.0 and not row["kept"]
        for group in {row["group"] for row in rows}:  # each kept group's advantages over its scored rows
            scored = [row for row in rows if row["group"] == group and not row.get("masked")]
            if len(scored) < 2 or not scored[0]["kept"]:
                continue
            values = torch.tensor([row["reward"] for row in scored])
            want = (values - values.mean()) / (values.std() + STD_EPS)
            assert [row["advantage"] for row in scored] == pytest.approx(want.tolist(), abs=1e-5)


@pytest.mark.slow
def test_past_max_masked_share_the_run_stops_with_exit_2_naming_reward_step_and_share(tmp_path, monkeypatch, capsys):
    from grpocli.cli.app import main

    (tmp_path / "graders.py").write_text(PICKY)
    monkeypatch.setattr(sys, "argv", ["grpo", "train", "quickstart", *FAST, f"train.output_dir={tmp_path / 'run'}",
                                      f'rewards=[{{name="length"}}, {{name="{tmp_path / "graders.py"}:down"}}]'])
    with pytest.raises(SystemExit) as done:
        main()
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert "Traceback" not in err, err
    assert ("reward 'down' could not score 16 of 16 samples at step 1 (100%, past rewards[1].max_masked_share = 0.5): "
            "it raised ConnectionError: grader down") in err, err
    assert 'rewards[1].on_error = "raise"' in err and "warning: reward 'down'" in err, err
