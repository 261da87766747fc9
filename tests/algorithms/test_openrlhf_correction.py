"""OpenRLHF 0.11's train/rollout importance correction (`--algo.advantage.is_correction_*`) against
OpenRLHF's own code, copied here as the oracle.

openrlhf 0.11.2 cannot be imported in this environment (openrlhf.models imports deepspeed and
flash_attn), so the oracle below is its code copied verbatim, unchanged:
`masked_mean` from openrlhf/models/utils.py, `aggregate_loss` and `PolicyLoss` from
openrlhf/models/loss.py, of the wheel openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl
(https://github.com/OpenRLHF/OpenRLHF, Apache License 2.0).

Each valid OpenRLHF option (is_correction_level token / seq, is_correction_mode mask / clip,
is_correction_gating ratio / binary_kl / tv, is_correction_threshold) is one entry of
IMPORTANCE_SAMPLING_MODES; two are entries TRL already had (token + ratio: `token_mask` with mode
mask, `token_truncate` with mode clip), the rest are OpenRLHF's own. The oracle's PPO loss with the
correction is compared with ours, the engine weights of the entry times the clipped surrogate
aggregated by dapo (OpenRLHF's token-level loss) or grpo (its per-sample loss): loss and gradient
agree to 1e-6 in float64.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
import torch.nn as nn

from grpocli.algorithms.losses import LossNorm, PolicyTerms, SurrogateSettings, clip_surrogate, dapo_loss, grpo_loss
from grpocli.algorithms.variants import IMPORTANCE_SAMPLING_MODES

TOL = 1e-6


# -- the oracle: OpenRLHF 0.11.2, copied verbatim -----------------------------------------------------------
# openrlhf/models/utils.py (0.11.2)
def masked_mean(tensor: torch.Tensor, mask: Optional[torch.Tensor], dim: int = None) -> torch.Tensor:
    if mask is None:
        return tensor.mean(dim=dim)
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


# openrlhf/models/loss.py (0.11.2)
def aggregate_loss(
    loss: torch.Tensor,
    loss_mask: torch.Tensor,
    token_level_loss: bool = True,
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar using one of two reduction modes:

    - ``token_level_loss=True``  -> per-token: masked-sum / global token count.
    - ``token_level_loss=False`` -> per-sample: sum of per-sequence token-means / global
      sample count.

    ``batch_num_tokens`` (token mode) and ``global_batch_size`` (sample mode) carry the
    *global* batch totals so the loss is invariant to data-parallel sharding; ``dp_size``
    compensates for the gradient averaging that DeepSpeed/DDP applies across DP ranks.
    """
    if token_level_loss:
        if batch_num_tokens is None:
            return masked_mean(loss, loss_mask, dim=None)
        return (loss * loss_mask).sum() / batch_num_tokens * dp_size

    token_counts = loss_mask.sum(dim=-1)
    seq_loss = (loss * loss_mask).sum(dim=-1) / (token_counts + 1e-8)
    seq_mask = (token_counts > 0).float()  # exclude fully masked sequences
    if global_batch_size is None:
        return masked_mean(seq_loss, seq_mask, dim=None)
    return (seq_loss * seq_mask).sum() / global_batch_size * dp_size



class PolicyLoss(nn.Module):
    """
    Policy Loss for PPO
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: list = (0.5, 5.0),
    ) -> None:
        super().__init__()
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.token_level_loss = token_level_loss
        self.dual_clip = dual_clip
        self.policy_loss_type = policy_loss_type
        # Train/rollout (DeepSpeed-actor vs vLLM) logprob-mismatch correction on the per-token
        # IS ratio pi_train/pi_rollout. A gate reads a statistic per unit (level: token, or the
        # per-sequence mean) and drops (mask) or clamps (clip) units outside [low, high].
        # gating selects the statistic: the ratio itself (TIS / ICEPOP / seq-mask-tis) or the
        # sampled-token binary_kl / tv divergence between rollout and train policy (a trust
        # region; FlashREINFORCE gates the per-sequence mean binary KL).
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = is_correction_threshold

        # GSPO requires sequence-level loss (per-sample mean)
        if policy_loss_type == "gspo":
            self.token_level_loss = False

        # Dual-clip PPO: https://arxiv.org/pdf/1912.09729
        if dual_clip is not None:
            assert dual_clip > 1.0, f"dual_clip must be > 1.0, got {dual_clip}"

        if is_correction_level not in {"off", "token", "seq"}:
            raise ValueError(f"is_correction_level must be off/token/seq, got {is_correction_level}")
        if is_correction_mode not in {"mask", "clip"}:
            raise ValueError(f"is_correction_mode must be mask/clip, got {is_correction_mode}")
        if is_correction_gating not in {"ratio", "binary_kl", "tv"}:
            raise ValueError(f"is_correction_gating must be ratio/binary_kl/tv, got {is_correction_gating}")
        # Only the per-token ratio is a weight that can be clamped; a per-sequence statistic or a
        # divergence is a rejection filter.
        if is_correction_mode == "clip" and (is_correction_level == "seq" or is_correction_gating != "ratio"):
            raise ValueError(
                "is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio"
            )
        # A divergence is bounded from above only; the default ratio band [0.5, 5] would reject everything.
        if is_correction_gating != "ratio" and is_correction_level != "off" and is_correction_threshold[0] > 0:
            raise ValueError(f"is_correction_gating={is_correction_gating} takes an upper bound only (a single delta)")

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: Optional[torch.Tensor] = None,
        rollout_log_probs: Optional[torch.Tensor] = None,
        dp_size: int = 1,
        batch_num_tokens: Optional[float] = None,
        global_batch_size: Optional[float] = None,
    ) -> torch.Tensor:
        raw_policy_log_ratio = log_probs - old_log_probs
        if self.policy_loss_type == "ppo":
            policy_log_ratio = raw_policy_log_ratio.clamp(min=-20.0, max=20.0)
            ratio = policy_log_ratio.exp()
        elif self.policy_loss_type == "gspo":
            # GSPO: https://arxiv.org/pdf/2507.18071
            if self.is_correction_level != "off":
                log_ratio = log_probs - rollout_log_probs
            else:
                log_ratio = raw_policy_log_ratio
            ratio = (log_ratio * action_mask).sum(dim=-1) / action_mask.sum(dim=-1).clamp(min=1)
            ratio = ratio.exp().unsqueeze(-1) * action_mask
        else:
            raise ValueError(f"Invalid policy loss type: {self.policy_loss_type}")

        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high) * advantages

        if self.dual_clip is None:
            # Standard PPO
            loss = -torch.min(surr1, surr2)
        else:
            # Standard PPO clipping
            clip1 = torch.min(surr1, surr2)
            # Dual-clip: additional lower bound for negative advantages
            clip2 = torch.max(clip1, self.dual_clip * advantages)
            # Apply dual-clip: use clip2 for negative advantages, clip1 for positive advantages
            loss = -torch.where(advantages < 0, clip2, clip1)

        # Your Efficient RL Framework Secretly Brings You Off-Policy RL Training: https://fengyao.notion.site/off-policy-rl
        vllm_kl = is_filter_ratio = None
        if self.is_correction_level != "off" and self.policy_loss_type == "ppo":
            low, high = self.is_correction_threshold
            seq_level = self.is_correction_level == "seq"
            is_log_ratio = (old_log_probs - rollout_log_probs).detach()  # log(pi_train / pi_rollout)
            token_is = is_log_ratio.exp()
            # Gated statistic per unit: at seq level the ratio's geometric mean, a divergence's plain mean.
            if self.is_correction_gating == "ratio":
                stat = masked_mean(is_log_ratio, action_mask, dim=-1).unsqueeze(-1) if seq_level else is_log_ratio
                stat = stat.exp()
            else:
                p = rollout_log_probs.exp().clamp(1e-6, 1 - 1e-6)  # clamp keeps the binary-KL logs finite
                q = old_log_probs.exp().clamp(1e-6, 1 - 1e-6)
                if self.is_correction_gating == "binary_kl":
                    stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
                else:  # tv
                    stat = (p - q).abs()
                if seq_level:
                    stat = masked_mean(stat, action_mask, dim=-1).unsqueeze(-1)
            if self.is_correction_mode == "clip":
                coef = stat.clamp(min=low, max=high)
                filtered = (stat < low) | (stat > high)
            else:  # mask: drop out-of-band units, survivors keep their per-token IS weight
                keep = (stat >= low) & (stat <= high)
                coef = torch.where(keep, token_is, 0.0)
                filtered = ~keep
            loss = coef * loss
            # Filter fraction at the unit's own granularity: per token, or per sequence.
            if seq_level:
                is_filter_ratio = filtered.float().mean()
            else:
                is_filter_ratio = masked_mean(filtered.float(), action_mask, dim=None)
            vllm_kl = masked_mean(rollout_log_probs - old_log_probs, action_mask, dim=None)

        loss = aggregate_loss(
            loss,
            action_mask,
            token_level_loss=self.token_level_loss,
            dp_size=dp_size,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )
        clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)
        ppo_kl = masked_mean(-raw_policy_log_ratio.detach(), action_mask, dim=None)
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio
# -- end of the oracle --------------------------------------------------------------------------------------


#: (level, mode, gating, threshold) -> (our entry, its clip_min, clip_max, divergence_max): every valid OpenRLHF
#: combination (mode clip needs level token and gating ratio; a divergence takes an upper bound only).
OPTIONS = {
    ("token", "clip", "ratio", (0.5, 2.0)): ("token_truncate", 0.5, 2.0, None),      # TIS: TRL's entry
    ("token", "mask", "ratio", (0.5, 2.0)): ("token_mask", 0.5, 2.0, None),          # IcePop: TRL's entry
    ("seq", "mask", "ratio", (0.8, 1.25)): ("sequence_geomean_mask", 0.8, 1.25, None),
    ("token", "mask", "binary_kl", (0.0, 0.1)): ("token_binary_kl_mask", None, None, 0.1),
    ("token", "mask", "tv", (0.0, 0.15)): ("token_tv_mask", None, None, 0.15),
    ("seq", "mask", "binary_kl", (0.0, 0.1)): ("sequence_binary_kl_mask", None, None, 0.1),
    ("seq", "mask", "tv", (0.0, 0.15)): ("sequence_tv_mask", None, None, 0.15),
}


def random_case(seed: int, n: int = 8, t: int = 12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()             # every row has a loss token
    old = torch.log(torch.rand(n, t, generator=g, dtype=torch.float64) * 0.98 + 0.01)  # p in (0.01, 0.99)
    # engine log-probs: some sequences near the trainer's, some far from it
    spread = torch.rand(n, 1, generator=g, dtype=torch.float64)
    engine = old + (torch.rand(n, t, generator=g, dtype=torch.float64) - 0.5) * 3 * spread
    engine = engine.clamp(max=-1e-3)
    new = (old + (torch.rand(n, t, generator=g, dtype=torch.float64) - 0.5) * 0.8).requires_grad_()
    advantages = torch.randn(n, 1, generator=g, dtype=torch.float64)
    return new, old, engine, advantages, mask


def weights(name: str, old, engine, mask, clip_min, clip_max, divergence_max):
    mode = IMPORTANCE_SAMPLING_MODES[name]
    extra = {"divergence_max": divergence_max} if mode.gates_divergence else {}
    return mode.fn(old, engine, mask, clip_min, clip_max, **extra)


@pytest.mark.parametrize("token_level_loss", [True, False], ids=["token_level", "per_sample"])
@pytest.mark.parametrize("option", list(OPTIONS), ids=["-".join(map(str, o[:3])) for o in OPTIONS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_entry_matches_openrlhf_policy_loss(seed, option, token_level_loss):
    level, mode, gating, threshold = option
    name, clip_min, clip_max, divergence_max = OPTIONS[option]
    new, old, engine, advantages, mask = random_case(seed)
    oracle = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, token_level_loss=token_level_loss,
                        is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
                        is_correction_threshold=list(threshold))
    expected, *_ = oracle(new, old, advantages.expand_as(mask), action_mask=mask, rollout_log_probs=engine)
    (expected_grad,) = torch.autograd.grad(expected, new)

    w = weights(name, old, engine, mask, clip_min, clip_max, divergence_max)            # [N, T]
    log_ratio = new - old
    x = PolicyTerms(logp=new, log_ratio=log_ratio, ratio=log_ratio.exp(), advantages=advantages, mask=mask)
    per_token, _, _ = clip_surrogate(x, SurrogateSettings(epsilon_low=0.2, epsilon_high=0.28))
    n, t = mask.shape
    norm = LossNorm(num_sequences=n, num_tokens=int(mask.sum()), max_completion_length=t, num_micro_batches=1)
    loss = (dapo_loss if token_level_loss else grpo_loss)(per_token * w, mask, norm)   # the step's phases 3, 5, 7
    (grad,) = torch.autograd.grad(loss, new)
    assert loss.item() == pytest.approx(expected.item(), rel=0, abs=TOL)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=TOL)
    # the case exercises the gate: some loss tokens dropped or clamped, some kept unchanged
    on = mask > 0
    ratio = (old - engine).exp()
    assert (w[on] != ratio[on]).any() and (w[on] == ratio[on]).any(), name


def test_openrlhf_refuses_what_has_no_entry():
    """Mode clip exists only for level token with gating ratio (token_truncate); a divergence has no lower bound."""
    for level, gating in (("seq", "ratio"), ("token", "binary_kl"), ("seq", "tv")):
        with pytest.raises(ValueError, match="is_correction_mode=clip requires"):
            PolicyLoss(is_correction_level=level, is_correction_mode="clip", is_correction_gating=gating)
    with pytest.raises(ValueError, match="upper bound only"):
        PolicyLoss(is_correction_level="token", is_correction_gating="tv", is_correction_threshold=[0.5, 5.0])
    covered = {(level, mode, gating) for level, mode, gating, _ in OPTIONS}
    assert len(covered) == 7 and {OPTIONS[o][0] for o in OPTIONS} <= set(IMPORTANCE_SAMPLING_MODES)


def test_by_hand():
    """Two sequences of two tokens. Trainer q = [0.5, 0.5] | [0.5, 0.2]; engine p = [0.5, 0.25] | [0.5, 0.4].
    Token ratios q / p: [1, 2] | [1, 0.5]; geometric means sqrt(2) = 1.414 | sqrt(0.5) = 0.707.
    TV |p - q|: [0, 0.25] | [0, 0.2], means 0.125 | 0.1.
    Binary KL p ln(p/q) + (1-p) ln((1-p)/(1-q)), token 2: 0.25 ln 0.5 + 0.75 ln 1.5 = 0.1308 |
    0.4 ln 2 + 0.6 ln 0.75 = 0.1046; means 0.0654 | 0.0523."""
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.2]], dtype=torch.float64))
    engine = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.4]], dtype=torch.float64))
    mask = torch.ones(2, 2, dtype=torch.float64)
    kl = [0.25 * math.log(0.5) + 0.75 * math.log(1.5), 0.4 * math.log(2.0) + 0.6 * math.log(0.75)]
    assert kl == pytest.approx([0.1308, 0.1046], abs=1e-4)
    cases = [  # (entry, clip_min, clip_max, divergence_max) -> weights
        ("sequence_geomean_mask", 0.8, 1.25, None, [[0.0, 0.0], [0.0, 0.0]]),  # 1.414 and 0.707: both out
        ("sequence_geomean_mask", 0.5, 1.5, None, [[1.0, 2.0], [1.0, 0.5]]),   # both in: each token's ratio
        ("sequence_geomean_mask", 0.75, 1.5, None, [[1.0, 2.0], [0.0, 0.0]]),  # the second out
        ("token_tv_mask", None, None, 0.22, [[1.0, 0.0], [1.0, 0.5]]),         # 0.25 > 0.22 >= 0.2
        ("sequence_tv_mask", None, None, 0.11, [[0.0, 0.0], [1.0, 0.5]]),      # 0.125 > 0.11 >= 0.1
        ("token_binary_kl_mask", None, None, 0.12, [[1.0, 0.0], [1.0, 0.5]]),  # 0.1308 > 0.12 >= 0.1046
        ("sequence_binary_kl_mask", None, None, 0.06, [[0.0, 0.0], [1.0, 0.5]]),  # 0.0654 > 0.06 >= 0.0523
        ("sequence_binary_kl_mask", None, None, 0.07, [[1.0, 2.0], [1.0, 0.5]]),
    ]
    for name, lo, hi, d, expected in cases:
        got = weights(name, old, engine, mask, lo, hi, d)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), msg=lambda m, n=name: f"{n}: {m}")
    # sequence_mask (TRL) reads the product of the ratios (2 and 0.5), not their geometric mean
    torch.testing.assert_close(weights("sequence_mask", old, engine, mask, 0.8, 1.25, None),
                               torch.tensor([[0.0], [0.0]], dtype=torch.float64))


def test_a_missing_engine_log_prob_is_no_correction():
    """As in TRL's modes (grpocli.algorithms.importance): a NaN engine log-prob is ratio 1 and divergence 0
    (OpenRLHF, which never gets one from vLLM, would drop the token or sequence)."""
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    engine = torch.tensor([[math.log(0.25), float("nan")]])
    mask = torch.ones(1, 2)
    for name in ("token_tv_mask", "token_binary_kl_mask"):
        torch.testing.assert_close(weights(name, old, engine, mask, None, None, 1.0), torch.tensor([[2.0, 1.0]]))
    torch.testing.assert_close(weights("sequence_geomean_mask", old, engine, mask, 0.5, 2.0, None),
                               torch.tensor([[2.0, 1.0]]))


@pytest.mark.parametrize("name", [n for n, e in IMPORTANCE_SAMPLING_MODES.items() if not e.per_sequence
                                  and n not in ("token_truncate", "token_mask")])
def test_micro_batch_weights_thread_the_divergence_bound(name):
    """grpocli.trainer.mismatch.importance_weights passes vllm.importance_sampling_divergence_max to the
    divergence gates and the bounds to the others; weights are 0 off the loss mask."""
    from grpocli.recipe.vllm_section import VllmSection
    from grpocli.trainer.mismatch import importance_weights

    part = SimpleNamespace(engine_logprobs=[[math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.4)], [-1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    mb = SimpleNamespace(index=torch.tensor([0, 1, 2]), loss_mask=mask)
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.2], [0.3, 0.3]]))
    gates = IMPORTANCE_SAMPLING_MODES[name].gates_divergence
    vllm = VllmSection(importance_sampling_mode=name, importance_sampling_clip_min=0.75, importance_sampling_clip_max=1.5,
                       importance_sampling_divergence_max=0.11 if gates else None)
    (got,), _ = importance_weights(part, (mb,), (old,), vllm)
    expected = weights(name, old, torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.4)],
                                                [-1.0, 0.0]]), mask, 0.75, 1.5, 0.11) * mask
    torch.testing.assert_close(got, expected)
    assert got[2].abs().sum() == 0 and got[:2].abs().sum() > 0


def test_the_divergence_bound_is_needed_by_the_gates_and_read_by_no_other():
    from pydantic import ValidationError

    from grpocli.recipe.vllm_section import VllmSection

    with pytest.raises(ValidationError, match="set importance_sampling_divergence_max"):
        VllmSection(importance_sampling_mode="sequence_binary_kl_mask")
    with pytest.raises(ValidationError, match="read only by"):
        VllmSection(importance_sampling_mode="token_mask", importance_sampling_divergence_max=0.1)
    with pytest.raises(ValidationError, match="greater than 0"):
        VllmSection(importance_sampling_mode="token_tv_mask", importance_sampling_divergence_max=0.0)
    VllmSection(importance_sampling_mode="token_tv_mask", importance_sampling_correction=False)  # not used: fine
    v = VllmSection(importance_sampling_mode="sequence_tv_mask", importance_sampling_divergence_max=0.1)
    assert v.importance_sampling_divergence_max == 0.1
