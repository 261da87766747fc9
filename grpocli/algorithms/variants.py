"""Every named variant of the algorithm: one entry each, with the properties the rest of grpo reads.

    LOSSES                     algorithm.loss                  per-token objective + aggregation
    ADVANTAGES                 algorithm.advantage_scale       group-relative advantage estimator
    KL_ESTIMATORS              algorithm.kl_estimator          per-token KL to the reference
    IMPORTANCE_SAMPLING_MODES  vllm.importance_sampling_mode   engine/trainer importance weights

An entry names its functions as attributes of the grpocli.algorithms modules ("losses:dapo_loss"),
imported when first used (and kept): this module imports no torch, so the recipe schema takes its accepted
names (and their descriptions) from these tables, and preflight derives its compatibility rules
from the entries' properties (grpocli.trainer.preflight). Each function's docstring names its
paper; tests/algorithms/test_variants.py checks every entry against hand-computed numbers and the
schema against the tables.

Adding a loss: write its per-token objective (and, if it needs a new one, its aggregation) in
grpocli/algorithms/losses.py, add a `Loss` entry below with its properties, and add its hand
numbers to tests/algorithms/test_variants.py. The recipe then accepts the name, `grpo inspect
fields algorithm` describes it, and preflight applies the rules its properties imply.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable


def resolve(ref: str) -> Callable[..., Any]:
    """The function a "module:name" reference (a module of grpocli.algorithms) names."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(f"grpocli.algorithms.{module}"), name)


@dataclass(frozen=True)
class Loss:
    """A loss: its per-token objective (`losses.*_surrogate`: PolicyTerms, SurrogateSettings ->
    (loss, low, high)) and how its per-token terms are aggregated (`losses.*_loss`: per_token,
    mask, LossNorm -> the micro-batch's contribution)."""

    objective: str
    aggregation: str
    summary: str                      # for the schema's description and the docs
    clipped: bool = False             # the clipped surrogate: algorithm.delta and clip_ratio_c apply
    sums_tokens: bool = False         # sums token terms: a sequence-level ratio weighs each sequence
                                      # by its length (run with a note, as TRL warns, with
                                      # importance_sampling_level = 'sequence')
    token_level_only: bool = False    # builds its own sequence weight from the token ratios:
                                      # 'token' importance sampling only
    own_engine_weights: bool = False  # weighs engine importance weights into its own objective
                                      # (instead of multiplying the per-token loss by them): the
                                      # engine's token weights, so per-token correction modes only
    filter_inside: bool = False       # the "80/20" entropy filter belongs inside its sequence weight
                                      # (TRL's GMPO takes the geometric mean over the kept tokens),
                                      # which the step's filter, applied after the objective, is not:
                                      # top_entropy_quantile < 1 is refused
    per_micro_batch: bool = False     # normalises by the micro-batch's own tokens: rows with
                                      # advantage 0 still change it, so they are computed
    aliases: tuple[str, ...] = ()     # other names the recipe accepts (verl's loss_agg_mode)

    @cached_property
    def objective_fn(self) -> Callable[..., Any]:
        return resolve(self.objective)

    @cached_property
    def aggregation_fn(self) -> Callable[..., Any]:
        return resolve(self.aggregation)


@dataclass(frozen=True)
class Advantage:
    """An advantage estimator: `fn(rewards [B, G], eps, *, components, weights) -> [B, G]`."""

    function: str
    summary: str
    needs_components: bool = False  # reads each reward's own values (components), not only the
                                    # weighted total: needs algorithm.reward_combination = 'sum'

    @cached_property
    def fn(self) -> Callable[..., Any]:
        return resolve(self.function)


@dataclass(frozen=True)
class KlEstimator:
    """A per-token KL estimator: `fn(logp [N, T], ref_logp [N, T]) -> [N, T]`, or a name that is
    recognised and refused (`refused` says why)."""

    function: str | None
    summary: str
    refused: str | None = None

    @cached_property
    def fn(self) -> Callable[..., Any]:
        if self.function is None:
            raise ValueError(f"this KL estimator is refused: {self.refused}")
        return resolve(self.function)


@dataclass(frozen=True)
class ImportanceMode:
    """Engine importance weights: `fn(old_logp, engine_logp, mask, clip_min, clip_max)` (and
    `divergence_max=` where `gates_divergence`), `[N, T]` per token or `[N, 1]` per sequence."""

    function: str
    summary: str
    per_sequence: bool = False  # one weight per completion, from its summed log-ratio
    clamps: bool = False        # clamps the ratio into the bounds (else zeroes it outside them): needs a bound
    gates_divergence: bool = False  # gates on a divergence of the two policies, not on the ratio: reads
                                    # vllm.importance_sampling_divergence_max (not clip_min / clip_max)

    @cached_property
    def fn(self) -> Callable[..., Any]:
        return resolve(self.function)


_CLIP = "losses:clip_surrogate"

#: algorithm.loss
LOSSES: dict[str, Loss] = {
    "grpo": Loss(_CLIP, "losses:grpo_loss", "mean of per-sequence token means (DeepSeekMath)",
                 clipped=True, aliases=("seq-mean-token-mean",)),
    "bnpo": Loss(_CLIP, "losses:bnpo_loss", "token mean per micro-batch (TRL)",
                 clipped=True, sums_tokens=True, per_micro_batch=True),
    "dr_grpo": Loss(_CLIP, "losses:dr_grpo_loss", "sum / (max_completion_length x sequences) (Dr. GRPO)",
                    clipped=True, sums_tokens=True, aliases=("seq-mean-token-sum-norm",)),
    "dapo": Loss(_CLIP, "losses:dapo_loss", "token mean over the batch (DAPO, TRL's default)",
                 clipped=True, sums_tokens=True, aliases=("token-mean",)),
    "luspo": Loss(_CLIP, "losses:luspo_loss", "per-sequence token sums, mean over sequences (LUSPO, with "
                  "importance_sampling_level = 'sequence')", clipped=True),
    "cispo": Loss("losses:cispo_surrogate", "losses:dapo_loss",
                  "clipped importance weight x A x logp, token mean (CISPO, MiniMax-M1)", sums_tokens=True),
    "sapo": Loss("losses:sapo_surrogate", "losses:grpo_loss", "soft sigmoid gate, grpo's aggregation (SAPO)"),
    "vespo": Loss("losses:vespo_surrogate", "losses:dapo_loss", "gamma-weighted sequence ratio, token mean (VESPO)",
                  token_level_only=True, own_engine_weights=True),
    "gmpo": Loss("losses:gmpo_surrogate", "losses:grpo_loss", "geometric mean of the token ratios per sequence, "
                 "each log-ratio clipped to [-epsilon_low, epsilon_high] (for gmpo these two are LOG-space bounds: "
                 "ratio in (e^-epsilon_low, e^epsilon_high); TRL's GMPOConfig default 0.4 and 0.4), -exp(mean) x A, "
                 "mean over sequences (GMPO; TRL's experimental GMPOTrainer)",
                 token_level_only=True, filter_inside=True),
}

#: algorithm.advantage_scale
ADVANTAGES: dict[str, Advantage] = {
    "group": Advantage("advantages:group_scaled_advantages",
                       "(r - group mean) / group std (DeepSeekMath GRPO, TRL scale_rewards='group')"),
    "batch": Advantage("advantages:batch_scaled_advantages",
                       "(r - group mean) / std of all rewards (TRL 'batch')"),
    "none": Advantage("advantages:centered_advantages", "r - group mean (Dr. GRPO, TRL 'none')"),
    "centered": Advantage("advantages:centered_advantages", "the same numbers as none under open-instruct's "
                          "name (advantage_normalization_type='centered')"),
    "rloo": Advantage("advantages:rloo_advantages", "r - mean of the group's other rewards (RLOO, TRL's RLOOTrainer)"),
    "reinforce_pp": Advantage("advantages:reinforce_pp_advantages", "r - group mean, then whitened over the batch "
                              "(REINFORCE++ baseline, verl's reinforce_plus_plus_baseline)"),
    "normalize_then_sum": Advantage("advantages:normalize_then_sum_advantages", "each reward normalized in its group, "
                                    "weighted sum, whitened over the batch (GDPO, with reward_combination = 'sum')",
                                    needs_components=True),
}

#: algorithm.kl_estimator
KL_ESTIMATORS: dict[str, KlEstimator] = {
    "k1": KlEstimator("kl:kl_k1", "Schulman's k1, logp - ref"),
    "k2": KlEstimator("kl:kl_k2", "Schulman's k2, (logp - ref)^2 / 2"),
    "k3": KlEstimator("kl:kl_k3", "Schulman's k3 (DeepSeekMath, TRL)"),
    "abs": KlEstimator("kl:kl_abs", "|logp - ref|"),
    "kl": KlEstimator("kl:kl_k1", "verl's name for k1"),
    "mse": KlEstimator("kl:kl_k2", "verl's name for k2"),
    "low_var_kl": KlEstimator("kl:kl_low_var", "k3 clamped to [-10, 10], verl's GRPO default"),
    "full": KlEstimator(None, "verl's name, recognised and refused", refused=(
        "kl_estimator = 'full' (verl's name) needs the reference model's whole next-token distribution at "
        "every completion token, not the sampled tokens' log-probs; verl's own KL loss raises "
        "NotImplementedError for it too")),
}

#: vllm.importance_sampling_mode (TRL's vllm_importance_sampling_mode)
IMPORTANCE_SAMPLING_MODES: dict[str, ImportanceMode] = {
    "token_truncate": ImportanceMode("importance:token_truncate", "per-token ratio clamped to [clip_min, clip_max] "
                                     "(TIS; ours, the default)", clamps=True),
    "token_mask": ImportanceMode("importance:token_mask", "per-token ratio, 0 outside the bounds (IcePop)"),
    "sequence_truncate": ImportanceMode("importance:sequence_truncate", "one ratio per completion from the summed "
                                        "log-ratio, clamped", per_sequence=True, clamps=True),
    "sequence_mask": ImportanceMode("importance:sequence_mask", "one ratio per completion, 0 outside the bounds "
                                    "(MIS; TRL's default, with clip_max 3.0)", per_sequence=True),
    # OpenRLHF 0.11's --algo.advantage.is_correction_* (token + ratio: token_mask with mode mask, token_truncate
    # with mode clip): a gate per token or per sequence; the tokens kept keep their own ratio, unbounded
    "sequence_geomean_mask": ImportanceMode("importance:sequence_geomean_mask", "each token's ratio, 0 for every "
                                            "token of a sequence whose geometric-mean ratio is outside the bounds "
                                            "(OpenRLHF is_correction_level seq, mode mask, gating ratio: "
                                            "'seq-mask-tis'; its default threshold 0.5 5.0)"),
    "token_binary_kl_mask": ImportanceMode("importance:token_binary_kl_mask", "each token's ratio, 0 where the "
                                           "binary KL of the sampled token's engine and trainer probabilities is "
                                           "above importance_sampling_divergence_max (OpenRLHF is_correction_level "
                                           "token, gating binary_kl)", gates_divergence=True),
    "token_tv_mask": ImportanceMode("importance:token_tv_mask", "each token's ratio, 0 where |p_engine - "
                                    "p_trainer| of the sampled token is above importance_sampling_divergence_max "
                                    "(OpenRLHF is_correction_level token, gating tv)", gates_divergence=True),
    "sequence_binary_kl_mask": ImportanceMode("importance:sequence_binary_kl_mask", "each token's ratio, 0 for "
                                              "every token of a sequence whose mean binary KL is above "
                                              "importance_sampling_divergence_max (OpenRLHF is_correction_level "
                                              "seq, gating binary_kl: FlashREINFORCE's trust region)",
                                              gates_divergence=True),
    "sequence_tv_mask": ImportanceMode("importance:sequence_tv_mask", "each token's ratio, 0 for every token of a "
                                       "sequence whose mean total variation is above "
                                       "importance_sampling_divergence_max (OpenRLHF is_correction_level seq, "
                                       "gating tv)", gates_divergence=True),
}


def loss_aliases() -> dict[str, str]:
    """Other names the recipe accepts for a loss -> the loss."""
    return {alias: name for name, entry in LOSSES.items() for alias in entry.aliases}


def names(table: dict[str, Any], *, where: Callable[[Any], bool] = lambda entry: True) -> list[str]:
    """The names of a table's entries (those `where` accepts), in table order."""
    return [name for name, entry in table.items() if where(entry)]


def described(table: dict[str, Any]) -> str:
    """'name: summary; ...' for a field's description."""
    return "; ".join(f"{name}: {entry.summary}" for name, entry in table.items())


__all__ = ["ADVANTAGES", "IMPORTANCE_SAMPLING_MODES", "KL_ESTIMATORS", "LOSSES", "Advantage", "ImportanceMode",
           "KlEstimator", "Loss", "described", "loss_aliases", "names", "resolve"]
