"""Per-token objectives of the losses (grpocli.algorithms.losses) against hand arithmetic (TRL's
numbers are in tests/trainer/test_trl_parity.py)."""

from __future__ import annotations

import math

import pytest
import torch

from grpocli.algorithms import (
    LOSSES,
    PolicyTerms,
    SurrogateSettings,
    cispo_surrogate,
    clip_surrogate,
    high_entropy_mask,
    importance_ratio,
    sapo_surrogate,
    vespo_surrogate,
)
from grpocli.algorithms.losses import vespo_weights

LN = math.log


def terms(ratios: list[float], advantages: list[float], logp: list[float] | None = None,
          mask: list[float] | None = None) -> PolicyTerms:
    """One token per sequence unless given: ratio r_i, advantage A_i, log-prob logp_i."""
    n = len(ratios)
    log_ratio = torch.tensor([[LN(r)] for r in ratios], dtype=torch.float64)
    lp = torch.tensor([[x] for x in (logp or [-1.0] * n)], dtype=torch.float64, requires_grad=True)
    return PolicyTerms(logp=lp, log_ratio=log_ratio, ratio=log_ratio.exp(),
                       advantages=torch.tensor([[a] for a in advantages], dtype=torch.float64),
                       mask=torch.tensor(mask or [[1.0]] * n, dtype=torch.float64))


def test_table_covers_every_loss():
    objective = {name: entry.objective_fn for name, entry in LOSSES.items()}
    assert objective["dapo"] is clip_surrogate and objective["cispo"] is cispo_surrogate
    assert objective["sapo"] is sapo_surrogate and objective["vespo"] is vespo_surrogate


def test_clip_delta_and_dual_clip():
    x = terms([1.5, 0.5, 3.0, 3.0], [1.0, -1.0, -2.0, -2.0])
    loss, low, high = clip_surrogate(x, SurrogateSettings(epsilon_low=0.2, epsilon_high=0.28))
    # -min(rA, clip(r)A): 1.5 -> min(1.5, 1.28) = 1.28; 0.5, A=-1 -> -min(-0.5, -0.8) = 0.8; 3, A=-2 -> 6
    assert loss.flatten().tolist() == pytest.approx([-1.28, 0.8, 6.0, 6.0])
    assert high.flatten().tolist() == [True, False, False, False]
    assert low.flatten().tolist() == [False, True, False, False]
    # INTELLECT-2: the unclipped ratio capped at delta = 2 -> 3 counts as 2: -min(-4, -2.56) = 4
    loss, _, _ = clip_surrogate(x, SurrogateSettings(epsilon_low=0.2, epsilon_high=0.28, delta=2.0))
    assert loss.flatten().tolist()[2] == pytest.approx(4.0)
    # dual clip c = 2.5: a negative advantage loses at most -c A = 5
    loss, _, _ = clip_surrogate(x, SurrogateSettings(epsilon_low=0.2, epsilon_high=0.28, clip_ratio_c=2.5))
    assert loss.flatten().tolist() == pytest.approx([-1.28, 0.8, 5.0, 5.0])


def test_cispo_clips_the_weight_and_keeps_the_gradient():
    x = terms([3.0, 0.5], [1.0, -1.0], logp=[-0.5, -2.0])
    loss, low, high = cispo_surrogate(x, SurrogateSettings(epsilon_high=2.0))
    # -sg(min(r, 2)) A logp: -(2)(1)(-0.5) = 1; -(0.5)(-1)(-2) = -1
    assert loss.flatten().tolist() == pytest.approx([1.0, -1.0])
    assert high.flatten().tolist() == [True, False]
    loss.sum().backward()  # d/dlogp = -w A, the weight is not differentiated
    assert x.logp.grad.flatten().tolist() == pytest.approx([-2.0, 0.5])


def test_sapo_soft_gate():
    x = terms([1.0, 1.5], [2.0, -1.0])
    loss, _, _ = sapo_surrogate(x, SurrogateSettings(sapo_temperature_pos=1.0, sapo_temperature_neg=2.0))
    # r = 1: sigmoid(0) * 4 / 1 = 2 -> -2 * 2 = -4 ; r = 1.5, tau 2: sigmoid(1) * 4 / 2 * 1 = 1.462117
    assert loss.flatten().tolist() == pytest.approx([-4.0, 2 / (1 + math.exp(-1.0))])


def test_vespo_gamma_weight():
    # one sequence of two tokens, log ratios ln 2 and 0 -> w = 2; A >= 0: k = 2, lambda = 3:
    # phi = e^3 * 2^2 * e^-6 = 4 e^-3
    x = PolicyTerms(logp=torch.tensor([[-1.0, -0.5]], dtype=torch.float64, requires_grad=True),
                    log_ratio=torch.tensor([[LN(2.0), 0.0]], dtype=torch.float64),
                    ratio=torch.tensor([[2.0, 1.0]], dtype=torch.float64),
                    advantages=torch.tensor([[1.0]], dtype=torch.float64),
                    mask=torch.ones(1, 2, dtype=torch.float64))
    phi = 4 * math.exp(-3.0)
    assert vespo_weights(x, SurrogateSettings()).item() == pytest.approx(phi)
    loss, _, _ = vespo_surrogate(x, SurrogateSettings())
    assert loss.flatten().tolist() == pytest.approx([phi * 1.0, phi * 0.5])  # -phi A logp
    # an engine weight of 0.5 on the first token: w = 2 * 0.5 = 1 -> phi(1) = 1
    x.engine_weight = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    assert vespo_weights(x, SurrogateSettings()).item() == pytest.approx(1.0)


def test_sequence_ratio_is_the_exp_of_the_mean_log_ratio():
    log_ratio = torch.tensor([[LN(2.0), LN(8.0), 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert importance_ratio(log_ratio, mask, "sequence").item() == pytest.approx(4.0)  # sqrt(2 * 8)
    assert importance_ratio(log_ratio, mask, "token").shape == (1, 3)


def test_high_entropy_mask_keeps_the_top_quantile():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    # 6 tokens; the top 50%: quantile 0.5 of (0.1, 0.2, 0.3, 0.5, 0.7, 0.9) = 0.4 -> 0.5, 0.7, 0.9
    kept = high_entropy_mask(entropy, mask, 0.5)
    assert kept.tolist() == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
