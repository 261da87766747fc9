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
from grpocli.algorithms.advantages import (
    normalize_then_sum_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)

NEEDS_COMPONENTS = {name for name, entry in ADVANTAGES.items() if entry.needs_components}

# Two prompts, three completions each.
REWARDS = torch.tensor([[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]])  # [B=2, G=3]


def test_table_names_match_the_recipe_values():
    from typing import get_args

    from grpocli.recipe.schema import AlgorithmSection

    names = {"group", "batch", "none", "centered", "rloo", "reinforce_pp", "normalize_then_sum"}
    assert set(ADVANTAGES) == names
    assert set(get_args(AlgorithmSection.model_fields["advantage_scale"].annotation)) == names
    assert ADVANTAGES["group"].fn is group_scaled_advantages
    assert ADVANTAGES["batch"].fn is batch_scaled_advantages
    assert ADVANTAGES["none"].fn is centered_advantages
    assert ADVANTAGES["centered"].fn is centered_advantages  # open-instruct's name for Dr. GRPO's
    assert ADVANTAGES["rloo"].fn is rloo_advantages
    assert ADVANTAGES["reinforce_pp"].fn is reinforce_pp_advantages
    assert ADVANTAGES["normalize_then_sum"].fn is normalize_then_sum_advantages
    assert NEEDS_COMPONENTS == {"normalize_then_sum"}


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


def test_rloo_subtracts_the_mean_of_the_others():
    # group 0: sum 3; 0 - (3 - 0) / 2 = -1.5; 1 - (3 - 1) / 2 = 0; 2 - (3 - 2) / 2 = 1.5
    # group 1: 3 - (9 - 3) / 2 = 0 for each
    expected = torch.tensor([[-1.5, 0.0, 1.5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(rloo_advantages(REWARDS), expected)
    # sum 6: 1 - 5 / 2 = -1.5 (twice); 4 - 2 / 2 = 3  (= 3/2 x the deviations -1, -1, 2)
    torch.testing.assert_close(rloo_advantages(torch.tensor([[1.0, 1.0, 4.0]])), torch.tensor([[-1.5, -1.5, 3.0]]))
    # G = 2: each completion's baseline is the other one: 5 - 1 = 4, 1 - 5 = -4
    torch.testing.assert_close(rloo_advantages(torch.tensor([[5.0, 1.0]])), torch.tensor([[4.0, -4.0]]))


def test_reinforce_pp_centers_per_group_then_whitens_over_the_batch():
    # REWARDS centered per group: -1, 0, 1 and 0, 0, 0; their mean 0
    # unbiased var over all six (1 + 0 + 1 + 0 + 0 + 0) / 5 = 0.4 (batch uses the raw rewards: 1.6)
    expected = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]) / (math.sqrt(0.4) + STD_EPS)
    torch.testing.assert_close(reinforce_pp_advantages(REWARDS), expected)
    # group means 2 and 2: centered -1, -1, 2 and -2, -2, 4; mean 0
    # squares 1 + 1 + 4 + 4 + 4 + 16 = 30; unbiased var 30 / 5 = 6
    rewards = torch.tensor([[1.0, 1.0, 4.0], [0.0, 0.0, 6.0]])
    expected = torch.tensor([[-1.0, -1.0, 2.0], [-2.0, -2.0, 4.0]]) / (math.sqrt(6.0) + STD_EPS)
    torch.testing.assert_close(reinforce_pp_advantages(rewards), expected)


# GDPO: two rewards (accuracy, format), weights 2 and 0.5; two prompts, three completions each.
ACCURACY = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
FORMAT = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
COMPONENTS = torch.tensor([ACCURACY, FORMAT]).permute(1, 2, 0)  # [B=2, G=3, R=2]
WEIGHTS = torch.tensor([2.0, 0.5])
TOTALS = torch.tensor([[2.5, 0.5, 0.0], [2.5, 2.5, 0.5]])  # 2 * accuracy + 0.5 * format


def test_normalize_then_sum_normalizes_each_reward_in_its_group_then_whitens():
    # Each 0/1 reward with one odd value in a group of 3 has unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2)
    # = sqrt(1/3); all-equal format in group 1 has std 0 -> normalized 0.
    k = 1.0 / (math.sqrt(1.0 / 3.0) + STD_EPS)
    # group 0: accuracy [1, 0, 0] -> [2/3, -1/3, -1/3] k; format [1, 1, 0] -> [1/3, 1/3, -2/3] k
    #          2 * acc + 0.5 * fmt = [4/3 + 1/6, -2/3 + 1/6, -2/3 - 1/3] k = [3/2, -1/2, -1] k
    # group 1: accuracy [1, 1, 0] -> [1/3, 1/3, -2/3] k; format 0 -> 2 * acc = [2/3, 2/3, -4/3] k
    summed = [[1.5, -0.5, -1.0], [2 / 3, 2 / 3, -4 / 3]]
    # batch: mean 0; squares 9/4 + 1/4 + 1 + 4/9 + 4/9 + 16/9 = 37/6; unbiased var 37/30 k^2
    scale = k / (k * math.sqrt(37 / 30) + STD_EPS)
    expected = torch.tensor(summed) * scale
    got = normalize_then_sum_advantages(TOTALS, components=COMPONENTS, weights=WEIGHTS)
    torch.testing.assert_close(got, expected)
    # the table entry takes the same keywords
    torch.testing.assert_close(ADVANTAGES["normalize_then_sum"].fn(TOTALS, components=COMPONENTS, weights=WEIGHTS),
                               expected)


def test_normalize_then_sum_keeps_what_the_total_loses():
    # GDPO's point: all four completions total 1, so the total has no spread (GRPO: all 0), yet
    # the three rewards differ in spread, so their group-normalized values do not cancel.
    # r1 [1, 1, 0, 0]: mean 1/2, deviations +-1/2, var (4 / 4) / 3 = 1/3 -> +-1/2 / sqrt(1/3)
    # r2 [0, 0, 1, 0]: mean 1/4, deviations -1/4 x3, 3/4; var (3/16 + 9/16) / 3 = 1/4 -> std 1/2
    # r3 [0, 0, 0, 1]: likewise, std 1/2
    components = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    totals = torch.ones(1, 4)
    assert torch.equal(group_scaled_advantages(totals), torch.zeros(1, 4))
    a = 0.5 / (math.sqrt(1 / 3) + STD_EPS)
    b = 0.25 / (0.5 + STD_EPS)
    # sums: [a - b - b, a - b - b, -a + 3b - b, -a - b + 3b] = [a - 2b, a - 2b, 2b - a, 2b - a]
    d = a - 2 * b
    # batch: mean 0, unbiased var 4 d^2 / 3
    expected = torch.tensor([[d, d, -d, -d]]) / (abs(d) * math.sqrt(4 / 3) + STD_EPS)
    torch.testing.assert_close(normalize_then_sum_advantages(totals, components=components), expected)


def test_normalize_then_sum_details():
    # None (NaN) counts as 0: accuracy with NaN for the zeros gives the same numbers
    with_none = COMPONENTS.clone()
    with_none[0, 1, 0] = with_none[0, 2, 0] = float("nan")
    torch.testing.assert_close(normalize_then_sum_advantages(TOTALS, components=with_none, weights=WEIGHTS),
                               normalize_then_sum_advantages(TOTALS, components=COMPONENTS, weights=WEIGHTS))
    # weight 0 leaves that reward out: only format [1, 1, 0] in group 0 (group 1's format is flat):
    # [1/3, 1/3, -2/3] / (sqrt(1/3) + eps) then whitened; squares 1/9 + 1/9 + 4/9 = 2/3, var 2/15
    k = 1.0 / (math.sqrt(1.0 / 3.0) + STD_EPS)
    expected = torch.tensor([[1 / 3, 1 / 3, -2 / 3], [0.0, 0.0, 0.0]]) * k / (k * math.sqrt(2 / 15) + STD_EPS)
    got = normalize_then_sum_advantages(TOTALS, components=COMPONENTS, weights=torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(got, expected)
    # without components the total is the one component: REWARDS -> [-1, 0, 1] / (1 + eps), then
    # whitened: squares 2 / (1 + eps)^2, var 0.4 / (1 + eps)^2
    c = 1.0 / (1.0 + STD_EPS)
    expected = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]) * c / (c * math.sqrt(0.4) + STD_EPS)
    torch.testing.assert_close(normalize_then_sum_advantages(REWARDS), expected)
    with pytest.raises(ValueError, match="components"):
        normalize_then_sum_advantages(REWARDS, components=torch.zeros(2, 2, 1))
    with pytest.raises(ValueError, match="weights"):
        normalize_then_sum_advantages(TOTALS, components=COMPONENTS, weights=torch.ones(3))


@pytest.mark.parametrize("name", sorted(set(ADVANTAGES) - NEEDS_COMPONENTS))
def test_estimators_of_the_total_ignore_components(name):
    fn = ADVANTAGES[name].fn
    torch.testing.assert_close(fn(TOTALS, components=COMPONENTS, weights=WEIGHTS), fn(TOTALS))


def test_centered_is_none_under_open_instructs_name():
    torch.testing.assert_close(ADVANTAGES["centered"].fn(REWARDS), torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_a_single_completion_gets_zero_advantage_not_nan(name):
    # G = 1 (B = 1 for batch): torch's unbiased std would be NaN; TRL uses 0 there
    assert torch.equal(ADVANTAGES[name].fn(torch.tensor([[0.7]])), torch.zeros(1, 1))


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
