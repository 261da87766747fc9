"""Pure tensor functions of GRPO, one module per concern:

    variants.py    the named variants (LOSSES, ADVANTAGES, KL_ESTIMATORS, IMPORTANCE_SAMPLING_MODES):
                   one entry each, with its properties; imports no torch (the recipe schema reads it)
    advantages.py  group-relative advantage estimators, zero-spread groups, DAPO's overlong penalty
    losses.py      per-token objectives (clipped surrogate, cispo, sapo, vespo) and aggregations
    kl.py          per-token KL estimators
    importance.py  engine/trainer importance weights and their mismatch figures
    logprobs.py    token log-probs and entropies without a float32 copy of the logits; one forward
                   pass over laid-out rows
    packing.py     rows of a micro-batch: padded, packed, or prompts shared by their completions

Names are imported lazily (PEP 562): ``import grpocli.algorithms.variants`` imports no torch;
``grpocli.algorithms.X`` imports the module that defines X.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "advantages": ("STD_EPS", "batch_scaled_advantages", "centered_advantages", "group_scaled_advantages",
                   "normalize_then_sum_advantages", "overlong_penalty", "reinforce_pp_advantages",
                   "rloo_advantages", "zero_spread_groups"),
    "losses": ("LossNorm", "PolicyTerms", "SurrogateSettings", "bnpo_loss", "cispo_surrogate", "clip_surrogate",
               "dapo_loss", "dr_grpo_loss", "grpo_loss", "high_entropy_mask", "importance_ratio", "luspo_loss",
               "sapo_surrogate", "vespo_surrogate", "vespo_weights"),
    "kl": ("kl_abs", "kl_k1", "kl_k2", "kl_k3", "kl_low_var"),
    "importance": ("mismatch_sums", "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"),
    "logprobs": ("DEFAULT_CHUNK_TOKENS", "differentiable_entropy", "sequence_logprobs", "token_entropy",
                 "token_logprobs"),
    "packing": ("Layout", "Rows", "build_rows", "choose_layout"),
    "variants": ("ADVANTAGES", "IMPORTANCE_SAMPLING_MODES", "KL_ESTIMATORS", "LOSSES"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpocli.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(f"grpocli.algorithms.{_EXPORTS[name]}"), name)
