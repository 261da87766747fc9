"""Advantage variants, zero-spread detection and DAPO's overlong penalty against hand arithmetic."""

import math

import pytest
import torch

from grpocli.algorithms import (
    ADVANTAGES,
    STD_EPS,
    batch_scaled_advantages,
    centered_advantages,
    group_scaled_advantages,
    overlong_penalty,
    zero_spread_groups,
)

# Two prompts, three completions each.
REWARDS = torch.tensor([[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]])  # [B=2, G=3]


def test_table_names_match_the_recipe_values():
    assert set(ADVANTAGES) == {"group", "batch", "none"}
    assert ADVANTAGES["group"] is group_scaled_advantages
    assert ADVANTAGES["batch"] is batch_scaled_advantages
    assert ADVANTAGES["none"] is centered_advantages


def test_group_divides_by_the_unbiased_group_std():
    # group 0: mean 1; deviations -1, 0, 1; unbiased var (1 + 0 + 1) / (3 - 1) = 1; std 1
    # group 1: all 3 -> deviations 0, std 0 -> 0 / (0 + eps) = 0
    expected = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]) / (1.0 + STD_EPS)
    torch.testing.assert_close(group_scaled_advantages(REWARDS), expected)


def test_group_with_unequal_deviations():
    # mean (1 + 1 + 4) / 3 = 2; deviations -1, -1, 2; var (1 + 1 + 4) / 2 = 3; std sqrt(3)
    rewards = torch.tensor([[1.0, 1.0, 4.0]])
    expected = torch.tensor([[-1.0, -1.0, 2.0]]) / (math.sqrt(3.0) + STD_EPS)
    torch.testing.assert_close(group_scaled_advantages(rewards), expected)


def test_batch_divides_by_the_std_of_all_rewards():
    # all six rewards 0, 1, 2, 3, 3, 3: mean 12 / 6 = 2
    # squared deviations 4 + 1 + 0 + 1 + 1 + 1 = 8; unbiased var 8 / 5 = 1.6
    # centering is still per group: group 0 -> -1, 0, 1; group 1 -> 0, 0, 0
    expected = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]) / (math.sqrt(1.6) + STD_EPS)
    torch.testing.assert_close(batch_scaled_advantages(REWARDS), expected)


def test_none_only_centers():
    # Dr. GRPO: r - group mean, no division
    expected = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(centered_advantages(REWARDS), expected)
    # scaled rewards keep their scale: 10x rewards -> 10x advantages
    torch.testing.assert_close(centered_advantages(10 * REWARDS), 10 * expected)


@pytest.mark.parametrize("name", ["group", "batch", "none"])
def test_a_single_completion_gets_zero_advantage_not_nan(name):
    # G = 1 (B = 1 for batch): torch's unbiased std would be NaN; TRL uses 0 there
    assert torch.equal(ADVANTAGES[name](torch.tensor([[0.7]])), torch.zeros(1, 1))


def test_zero_spread_groups():
    rewards = torch.tensor(
        [
            [0.0, 1.0, 2.0],  # spread 2 -> False
            [3.0, 3.0, 3.0],  # spread 0 -> True
            [1.0, 1.0 + 1e-7, 1.0],  # spread ~1.2e-7 <= 1e-6 -> True
            [0.5, 0.5, 0.5 + 1e-4],  # spread 1e-4 > 1e-6 -> False
        ]
    )
    assert zero_spread_groups(rewards).tolist() == [False, True, True, False]


def test_overlong_penalty_ramps_linearly_over_the_buffer():
    # max_len 10, buffer 4 -> ramp starts after 6 tokens: (6 - length) / 4 * 1
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    # 3 -> 0; 6 -> 0; 7 -> -1/4; 8 -> -2/4; 10 -> -4/4; 12 -> capped at -1
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, max_len=10, buffer_len=4, penalty=1.0), expected)


def test_overlong_penalty_scales_with_penalty_and_is_off_without_buffer():
    lengths = torch.tensor([8, 10])
    # penalty 0.5: 8 -> -2/4 * 0.5 = -0.25; 10 -> -0.5
    torch.testing.assert_close(
        overlong_penalty(lengths, max_len=10, buffer_len=4, penalty=0.5), torch.tensor([-0.25, -0.5])
    )
    assert torch.equal(overlong_penalty(lengths, max_len=10, buffer_len=0, penalty=1.0), torch.zeros(2))
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, max_len=10, buffer_len=11)
