"""KL estimators against hand arithmetic (Schulman, "Approximating KL Divergence")."""

import math

import torch

from grpocli.algorithms import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3, kl_low_var

LN2 = math.log(2.0)  # 0.693147...
# token 0: policy p = 0.5, reference q = 0.25 -> logp - ref = ln 2
# token 1: policy p = 0.25, reference q = 0.5 -> logp - ref = -ln 2
# token 2: equal -> 0
LOGP = torch.log(torch.tensor([[0.5, 0.25, 0.3]]))  # [N=1, T=3]
REF = torch.log(torch.tensor([[0.25, 0.5, 0.3]]))


def test_table():
    functions = {name: e.fn for name, e in KL_ESTIMATORS.items() if not e.refused}
    assert functions == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs,
                         "kl": kl_k1, "mse": kl_k2, "low_var_kl": kl_low_var}  # verl's names


def test_low_var_kl_is_k3_with_verl_clamps():
    torch.testing.assert_close(kl_low_var(LOGP, REF), kl_k3(LOGP, REF))  # inside the clamps: k3
    # log_r = ref - logp = 30 -> clamped to 20 before exp: exp(20) - 20 - 1, then clamped to 10
    far = kl_low_var(torch.tensor([[-30.0, 0.0]]), torch.tensor([[0.0, -3.0]]))
    # second token: log_r = -3 -> exp(-3) + 3 - 1 = 2.049787
    torch.testing.assert_close(far, torch.tensor([[10.0, math.exp(-3.0) + 2.0]]))


def test_k1():
    torch.testing.assert_close(kl_k1(LOGP, REF), torch.tensor([[LN2, -LN2, 0.0]]))


def test_k2():
    # 0.5 * (ln 2)^2 = 0.5 * 0.480453 = 0.240227 for both signs
    half_sq = 0.5 * LN2**2
    torch.testing.assert_close(kl_k2(LOGP, REF), torch.tensor([[half_sq, half_sq, 0.0]]))


def test_k3():
    # token 0: r = q/p = 0.5 -> 0.5 - ln 0.5 - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # token 1: r = 2 -> 2 - ln 2 - 1 = 0.306853
    expected = torch.tensor([[0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0, 0.0]])
    torch.testing.assert_close(kl_k3(LOGP, REF), expected)


def test_abs():
    torch.testing.assert_close(kl_abs(LOGP, REF), torch.tensor([[LN2, LN2, 0.0]]))


def test_k3_is_unbiased_for_the_true_kl():
    # E_{x~p}[k3] = KL(p || q). p = (0.5, 0.25, 0.25), q = (0.25, 0.5, 0.25):
    # KL = 0.5 ln 2 + 0.25 ln 0.5 + 0 = 0.25 ln 2 = 0.173287
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.5, 0.25])
    k3 = kl_k3(p.log()[None], q.log()[None])[0]  # [3]
    torch.testing.assert_close((p * k3).sum(), torch.tensor(0.25 * LN2))
