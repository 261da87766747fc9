"""Clipped surrogate and loss aggregations against hand arithmetic; micro-batch invariance."""

import math

import pytest
import torch

from grpocli.algorithms import (
    LOSSES,
    LossNorm,
    PolicyTerms,
    SurrogateSettings,
    bnpo_loss,
    clip_surrogate,
    dapo_loss,
    dr_grpo_loss,
    grpo_loss,
    luspo_loss,
)


def clipped_surrogate(logp, old_logp, advantages, epsilon_low, epsilon_high):
    """The clipped surrogate of `logp` against `old_logp` (token ratios, every token in the mask)."""
    log_ratio = logp - old_logp
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    x = PolicyTerms(logp=logp, log_ratio=log_ratio, ratio=log_ratio.exp(), advantages=adv,
                    mask=torch.ones_like(logp))
    return clip_surrogate(x, SurrogateSettings(epsilon_low=epsilon_low, epsilon_high=epsilon_high))

# Two sequences of two tokens with ratios pi/pi_old:
#   row 0 (A = +1): ratios 1.5, 0.5      row 1 (A = -2): ratios 0.5, 1.5
RATIOS = torch.tensor([[1.5, 0.5], [0.5, 1.5]])
ADV = torch.tensor([1.0, -2.0])  # [N]
OLD = torch.zeros(2, 2)


def test_clipped_surrogate_by_hand():
    logp = RATIOS.log().requires_grad_()
    loss, low, high = clipped_surrogate(logp, OLD, ADV, epsilon_low=0.2, epsilon_high=0.2)
    # row 0 tok 0: min(1.5 * 1, clip 1.2 * 1) = 1.2 -> loss -1.2 (clipped high, A > 0)
    # row 0 tok 1: min(0.5 * 1, clip 0.8 * 1) = 0.5 -> loss -0.5 (ratio < 0.8 but A > 0: not clipped)
    # row 1 tok 0: min(0.5 * -2, 0.8 * -2) = min(-1.0, -1.6) = -1.6 -> loss 1.6 (clipped low, A < 0)
    # row 1 tok 1: min(1.5 * -2, 1.2 * -2) = min(-3.0, -2.4) = -3.0 -> loss 3.0 (not clipped)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5], [1.6, 3.0]]))
    assert low.tolist() == [[False, False], [True, False]]
    assert high.tolist() == [[True, False], [False, False]]
    # d loss / d logp = -A * ratio where the unclipped term is the min, 0 where clipped:
    # row 0 tok 1: -1 * 0.5 = -0.5; row 1 tok 1: 2 * 1.5 = 3.0
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5], [0.0, 3.0]]))


def test_clip_higher_widens_only_the_upper_bound():
    # DAPO: epsilon_high 0.28 -> row 0 tok 0: min(1.5, 1.28) = 1.28
    loss, _, high = clipped_surrogate(RATIOS.log(), OLD, ADV, epsilon_low=0.2, epsilon_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5], [1.6, 3.0]]))
    assert high[0, 0]


def test_per_token_advantages_are_accepted():
    adv = ADV[:, None].expand(2, 2)  # [N, T]
    torch.testing.assert_close(
        clipped_surrogate(RATIOS.log(), OLD, adv, 0.2, 0.2)[0],
        clipped_surrogate(RATIOS.log(), OLD, ADV, 0.2, 0.2)[0],
    )


def test_ratio_one_gives_minus_advantage():
    # first iteration: old_logp = logp.detach() -> ratio 1 -> loss = -A on every token
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    loss, low, high = clipped_surrogate(logp, logp, ADV, 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -1.0], [2.0, 2.0]]))
    assert not low.any() and not high.any()


# Aggregations. Masked token sums: row 0 = 1+2+3 = 6 (3 tokens), row 1 = 4 (1 token),
# row 2 = 7+8 = 15 (2 tokens); total 25 over 6 tokens.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])  # [N=3, T=3]
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])


def _norm(micro_batches: int = 1) -> LossNorm:
    return LossNorm(num_sequences=3, num_tokens=6, max_completion_length=4, num_micro_batches=micro_batches)


def test_table():
    aggregations = {name: entry.aggregation_fn for name, entry in LOSSES.items()}
    assert aggregations == {"grpo": grpo_loss, "bnpo": bnpo_loss, "dr_grpo": dr_grpo_loss, "dapo": dapo_loss,
                            "cispo": dapo_loss, "sapo": grpo_loss, "luspo": luspo_loss, "vespo": dapo_loss,
                            "gmpo": grpo_loss}


def test_luspo_and_token_mean_override_by_hand():
    # luspo: every token's loss summed, divided by the 3 sequences: (6 + 4 + 15) / 3
    assert luspo_loss(LOSS, MASK, _norm()).item() == pytest.approx(25 / 3)
    # dapo with TRL's generation-batch count (say 10 tokens): 25 / 10
    norm = LossNorm(num_sequences=3, num_tokens=6, max_completion_length=4, num_micro_batches=1,
                    token_mean_tokens=10.0)
    assert dapo_loss(LOSS, MASK, norm).item() == pytest.approx(2.5)


def test_aggregations_by_hand():
    # grpo: (6/3 + 4/1 + 15/2) / 3 = (2 + 4 + 7.5) / 3 = 4.5
    assert grpo_loss(LOSS, MASK, _norm()).item() == pytest.approx(4.5)
    # bnpo, one micro-batch: 25 / 6
    assert bnpo_loss(LOSS, MASK, _norm()).item() == pytest.approx(25 / 6)
    # dr_grpo: 25 / (4 * 3) = 2.083333
    assert dr_grpo_loss(LOSS, MASK, _norm()).item() == pytest.approx(25 / 12)
    # dapo: 25 / 6 tokens
    assert dapo_loss(LOSS, MASK, _norm()).item() == pytest.approx(25 / 6)


def test_bool_mask_works_like_an_int_mask():
    assert grpo_loss(LOSS, MASK.bool(), _norm()).item() == pytest.approx(4.5)


# Micro-batch splits of the 3 rows; the second split also trims padding columns per micro-batch
# (rows 1 and 2 have no active token in column 2), as a token-budget packer would.
SPLITS = [
    [(slice(0, 3), slice(0, 3))],
    [(slice(0, 1), slice(0, 3)), (slice(1, 3), slice(0, 2))],
    [(slice(0, 2), slice(0, 3)), (slice(2, 3), slice(0, 2))],
    [(slice(i, i + 1), slice(0, 3)) for i in range(3)],
]


def _split_total(name: str, split) -> tuple[float, torch.Tensor]:
    leaf = LOSS.clone().requires_grad_()
    norm = _norm(micro_batches=len(split))
    total = sum(LOSSES[name].aggregation_fn(leaf[r, c], MASK[r, c], norm) for r, c in split)
    total.backward()
    return total.item(), leaf.grad


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo"])
def test_split_invariance_of_value_and_gradient(name):
    whole_value, whole_grad = _split_total(name, SPLITS[0])
    for split in SPLITS[1:]:
        value, grad = _split_total(name, split)
        assert value == pytest.approx(whole_value)
        torch.testing.assert_close(grad, whole_grad)


def test_gradients_by_hand():
    # grpo: d/dl_it = mask / (T_i * 3): row 0 -> 1/9, row 1 -> 1/3, row 2 -> 1/6
    g = _split_total("grpo", SPLITS[1])[1]
    torch.testing.assert_close(g, torch.tensor([[1 / 9] * 3, [1 / 3, 0, 0], [1 / 6, 1 / 6, 0]]))
    # dapo: mask / 6; dr_grpo: mask / 12
    torch.testing.assert_close(_split_total("dapo", SPLITS[2])[1], MASK / 6)
    torch.testing.assert_close(_split_total("dr_grpo", SPLITS[3])[1], MASK / 12)


def test_bnpo_depends_on_the_split_like_trl():
    # split rows {0, 1} | {2}: (6 + 4) / 4 = 2.5 and 15 / 2 = 7.5; mean of the two = 5.0
    assert _split_total("bnpo", SPLITS[2])[0] == pytest.approx(5.0)
    # the whole batch in one micro-batch: 25 / 6
    assert _split_total("bnpo", SPLITS[0])[0] == pytest.approx(25 / 6)


def test_ddp_average_times_world_size_gives_the_batch_gradient():
    # Two processes, each with micro-batches of the batch; DDP averages their gradients.
    norm = LossNorm(num_sequences=3, num_tokens=6, max_completion_length=4, num_micro_batches=2, world_size=2)
    grads = []
    for r, c in SPLITS[1]:  # process 0 gets row 0, process 1 rows 1-2
        leaf = LOSS.clone().requires_grad_()
        (dapo_loss(leaf[r, c], MASK[r, c], norm) * norm.world_size).backward()
        grads.append(leaf.grad)
    torch.testing.assert_close((grads[0] + grads[1]) / 2, MASK / 6)  # the one-process gradient


def test_empty_mask_gives_zero_not_nan():
    empty = torch.zeros(3, 3)
    norm = LossNorm(num_sequences=3, num_tokens=0, max_completion_length=4, num_micro_batches=1)
    for entry in LOSSES.values():
        value = entry.aggregation_fn(LOSS, empty, norm)
        assert not math.isnan(value.item()) and value.item() == 0.0


def test_loss_norm_rejects_impossible_counts():
    with pytest.raises(ValueError, match="num_sequences"):
        LossNorm(num_sequences=0, num_tokens=1, max_completion_length=4, num_micro_batches=1)
    with pytest.raises(ValueError, match="num_tokens"):
        LossNorm(num_sequences=1, num_tokens=-1, max_completion_length=4, num_micro_batches=1)
