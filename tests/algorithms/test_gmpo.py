"""GMPO (algorithm.loss = "gmpo") against TRL 1.16's own trainer, run here.

The oracle is `trl.experimental.gmpo.GMPOTrainer._compute_loss`, called as a plain function on a
stand-in `self` that gives it fixed log-probs (no model, no accelerator: one process, one
micro-batch, training mode). Ours is the training step's `micro_batch_loss` (objective, KL,
aggregation) with the same log-probs as its forward pass. Loss and gradient agree to 1e-6 in float64.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpocli.algorithms.losses import LossNorm, PolicyTerms, SurrogateSettings, gmpo_surrogate, grpo_loss
from grpocli.algorithms.variants import LOSSES

TOL = 1e-6


def trl_gmpo_loss(logp, old, ref, advantages, mask, entropies, *, epsilon_low, epsilon_high, beta,
                  top_entropy_quantile=1.0):
    """TRL's GMPO loss on fixed inputs: `GMPOTrainer._compute_loss` with a stand-in self."""
    gmpo = pytest.importorskip("trl.experimental.gmpo")
    from trl.trainer.grpo_trainer import GRPOTrainer

    n, t = mask.shape
    accelerator = SimpleNamespace(reduce=lambda x, reduction: x, gather=lambda x: x,
                                  pad_across_processes=lambda x, dim, pad_index: x)
    this = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, entropies, None),
        top_entropy_quantile=top_entropy_quantile, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
        beta=beta, model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, accelerator=accelerator,
    )
    this.get_high_entropy_mask = lambda e, m, q: GRPOTrainer.get_high_entropy_mask(this, e, m, q)
    inputs = {
        "prompt_ids": torch.ones(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.ones(n, t, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
    }
    return gmpo.GMPOTrainer._compute_loss(this, None, inputs), this._metrics["train"]


def ours(logp, old, ref, advantages, mask, entropies, *, epsilon_low, epsilon_high, beta):
    """The training step's share of the batch loss for one micro-batch holding the whole batch."""
    from grpocli.trainer.step import LossSettings, micro_batch_loss

    n, t = mask.shape
    settings = LossSettings(loss="gmpo", beta=beta, kl_estimator="k3", temperature=1.0, max_completion_length=t,
                            surrogate=SurrogateSettings(epsilon_low=epsilon_low, epsilon_high=epsilon_high))
    norm = LossNorm(num_sequences=n, num_tokens=int(mask.sum()), max_completion_length=t, num_micro_batches=1)
    mb = SimpleNamespace(loss_mask=mask, advantages=advantages)  # [n]: the step makes it [n, 1]

    def forward(model, micro_batch, temperature, **_):
        return logp, entropies

    loss, stats = micro_batch_loss(None, mb, (old, ref if beta > 0 else None, None), settings, norm, forward)
    return loss, stats


def random_case(seed: int, n: int = 6, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()        # every row has a loss token
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3 * mask
    # log-ratios up to +-0.8: inside and outside eps 0.4 (and 0.2), both signs of A
    new = ((old + (torch.rand(n, t, generator=g, dtype=torch.float64) - 0.5) * 1.6) * mask).requires_grad_()
    ref = old + (torch.rand(n, t, generator=g, dtype=torch.float64) - 0.5) * mask
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    entropies = torch.rand(n, t, generator=g, dtype=torch.float64) * 2 * mask
    return new, old, ref, advantages, mask, entropies


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.2, 0.3)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gmpo_matches_trl_gmpo_trainer(seed, eps, beta):
    epsilon_low, epsilon_high = eps
    new, old, ref, advantages, mask, entropies = random_case(seed)
    args = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high, beta=beta)
    expected, metrics = trl_gmpo_loss(new, old, ref, advantages, mask, entropies, **args)
    (expected_grad,) = torch.autograd.grad(expected, new)

    loss, stats = ours(new, old, ref, advantages, mask, entropies, **args)
    (grad,) = torch.autograd.grad(loss, new)
    assert loss.item() == pytest.approx(expected.item(), rel=0, abs=TOL)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=TOL)
    # TRL's clip metrics: the share of low / high clipped tokens, the KL's token mean
    tokens = mask.sum().item()
    assert stats[3].item() / tokens == pytest.approx(metrics["clip_ratio/low_mean"][0], abs=TOL)
    assert stats[4].item() / tokens == pytest.approx(metrics["clip_ratio/high_mean"][0], abs=TOL)
    assert stats[3].item() + stats[4].item() > 0  # the case clips somewhere
    if beta > 0:
        assert stats[1].item() / tokens == pytest.approx(metrics["kl"][0], abs=TOL)


def test_gmpo_by_hand():
    """Two sequences, eps 0.4 (log space).
    Row 0, A = +1: log-ratios 0.6, -0.2 -> clipped min(x, clamp(x)) = 0.4, -0.2 -> mean 0.1 -> -e^0.1.
    Row 1, A = -2: log-ratios -0.6, 0.2, (masked 5.0) -> max(x, clamp(x)) = -0.4, 0.2 -> mean -0.1 -> +2 e^-0.1.
    grpo aggregation: (-e^0.1 + 2 e^-0.1) / 2."""
    log_ratio = torch.tensor([[0.6, -0.2, 0.0], [-0.6, 0.2, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    x = PolicyTerms(logp=torch.zeros_like(log_ratio), log_ratio=log_ratio, ratio=log_ratio.exp(),
                    advantages=torch.tensor([[1.0], [-2.0]], dtype=torch.float64), mask=mask)
    per_sequence, low, high = gmpo_surrogate(x, SurrogateSettings(epsilon_low=0.4, epsilon_high=0.4))
    assert per_sequence.shape == (2, 1)
    torch.testing.assert_close(per_sequence, torch.tensor([[-math.exp(0.1)], [2 * math.exp(-0.1)]],
                                                          dtype=torch.float64))
    assert high.tolist() == [[True, False, False], [False, False, False]]  # 0.6 > 0.4 with A > 0
    assert low.tolist() == [[False, False, False], [True, False, False]]   # -0.6 < -0.4 with A < 0
    norm = LossNorm(num_sequences=2, num_tokens=4, max_completion_length=3, num_micro_batches=1)
    assert grpo_loss(per_sequence, mask, norm).item() == pytest.approx((-math.exp(0.1) + 2 * math.exp(-0.1)) / 2)
    assert LOSSES["gmpo"].objective_fn is gmpo_surrogate and LOSSES["gmpo"].aggregation_fn is grpo_loss


def test_the_entropy_filter_belongs_inside_the_geometric_mean():
    """TRL's GMPO with top_entropy_quantile < 1 takes the geometric mean over the kept tokens only: our
    objective with the kept mask as its mask gives that, while the step's filter (applied after the
    objective) would not; so preflight refuses the combination (the entry's filter_inside)."""
    from grpocli.algorithms.losses import high_entropy_mask
    from grpocli.errors import UserError
    from grpocli.recipe import load_recipe
    from grpocli.trainer.preflight import _check_combinations

    new, old, ref, advantages, mask, entropies = random_case(5)
    expected, _ = trl_gmpo_loss(new, old, ref, advantages, mask, entropies, epsilon_low=0.4, epsilon_high=0.4,
                                beta=0.0, top_entropy_quantile=0.5)
    kept = high_entropy_mask(entropies, mask, 0.5)
    x = PolicyTerms(logp=new, log_ratio=new - old, ratio=(new - old).exp(), advantages=advantages.unsqueeze(1),
                    mask=kept)
    per_sequence, _, _ = gmpo_surrogate(x, SurrogateSettings(epsilon_low=0.4, epsilon_high=0.4))
    n, t = mask.shape
    norm = LossNorm(num_sequences=n, num_tokens=int(mask.sum()), max_completion_length=t, num_micro_batches=1)
    assert grpo_loss(per_sequence, mask, norm).item() == pytest.approx(expected.item(), abs=TOL)
    # the step's order: the objective over every loss token, then multiplied by the kept mask
    after, _, _ = gmpo_surrogate(PolicyTerms(logp=new, log_ratio=new - old, ratio=(new - old).exp(),
                                             advantages=advantages.unsqueeze(1), mask=mask),
                                 SurrogateSettings(epsilon_low=0.4, epsilon_high=0.4))
    assert abs(grpo_loss(after * kept, mask, norm).item() - expected.item()) > 1e-3
    with pytest.raises(UserError, match="top_entropy_quantile"):
        _check_combinations(load_recipe("quickstart", ["algorithm.loss='gmpo'",
                                                       "algorithm.top_entropy_quantile=0.5"]).recipe)
    with pytest.raises(UserError, match="importance_sampling_level"):
        _check_combinations(load_recipe("quickstart", ["algorithm.loss='gmpo'",
                                                       "algorithm.importance_sampling_level='sequence'"]).recipe)


def test_trl_gmpo_config_defaults_are_what_the_docs_say():
    """docs/algorithm.md: TRL's GMPOConfig is epsilon = 0.4 (epsilon_high = epsilon), beta = 0."""
    gmpo = pytest.importorskip("trl.experimental.gmpo")
    fields = gmpo.GMPOConfig.__dataclass_fields__
    assert fields["epsilon"].default == 0.4 and fields["epsilon_high"].default is None
    assert fields["beta"].default == 0.0
