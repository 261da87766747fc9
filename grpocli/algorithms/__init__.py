"""Pure tensor functions of GRPO: advantages, policy losses, KL estimators, token log-probs.

Each variant is a named function in a table keyed by its recipe name:
`ADVANTAGES[algorithm.advantage_scale]`, `SURROGATES[algorithm.loss]` (per-token objective),
`LOSSES[algorithm.loss]` (its aggregation), `KL_ESTIMATORS[algorithm.kl_estimator]`,
`IMPORTANCE_SAMPLING_MODES[vllm.importance_sampling_mode]`.
Imports torch: keep it out of `grpo --help`'s imports.
"""

from grpocli.algorithms.advantages import (
    ADVANTAGES,
    NEEDS_COMPONENTS,
    STD_EPS,
    batch_scaled_advantages,
    centered_advantages,
    group_scaled_advantages,
    normalize_then_sum_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
    zero_spread_groups,
)
from grpocli.algorithms.importance import (
    IMPORTANCE_SAMPLING_MODES,
    mismatch_sums,
    sequence_mask,
    sequence_truncate,
    token_mask,
    token_truncate,
    truncated_importance_weights,
)
from grpocli.algorithms.kl import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3, kl_low_var
from grpocli.algorithms.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    logprobs_from_model,
    token_entropy,
    token_logprobs,
)
from grpocli.algorithms.losses import (
    LOSSES,
    LossNorm,
    bnpo_loss,
    clipped_surrogate,
    dapo_loss,
    dr_grpo_loss,
    grpo_loss,
    luspo_loss,
)
from grpocli.algorithms.surrogates import (
    OWN_ENGINE_WEIGHTS,
    SURROGATES,
    PolicyTerms,
    SurrogateSettings,
    cispo_surrogate,
    clip_surrogate,
    high_entropy_mask,
    importance_ratio,
    sapo_surrogate,
    vespo_surrogate,
)

__all__ = [
    "NEEDS_COMPONENTS",
    "normalize_then_sum_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "OWN_ENGINE_WEIGHTS",
    "SURROGATES",
    "PolicyTerms",
    "SurrogateSettings",
    "cispo_surrogate",
    "clip_surrogate",
    "high_entropy_mask",
    "importance_ratio",
    "kl_low_var",
    "luspo_loss",
    "sapo_surrogate",
    "vespo_surrogate",
    "IMPORTANCE_SAMPLING_MODES",
    "mismatch_sums",
    "sequence_mask",
    "sequence_truncate",
    "token_mask",
    "token_truncate",
    "truncated_importance_weights",
    "ADVANTAGES",
    "DEFAULT_CHUNK_TOKENS",
    "KL_ESTIMATORS",
    "LOSSES",
    "STD_EPS",
    "LossNorm",
    "batch_scaled_advantages",
    "bnpo_loss",
    "centered_advantages",
    "clipped_surrogate",
    "dapo_loss",
    "dr_grpo_loss",
    "group_scaled_advantages",
    "grpo_loss",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "logprobs_from_model",
    "overlong_penalty",
    "token_entropy",
    "token_logprobs",
    "zero_spread_groups",
]
