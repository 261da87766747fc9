"""The [algorithm] section: advantages, the loss and its conventions, KL, and which rows count.

Wired into ``Recipe`` by grpocli.recipe.schema as ``algorithm: AlgorithmSection``. Each
description says whose convention a value is (DeepSeekMath, TRL, verl, open-instruct), and
``grpo inspect fields algorithm`` prints them; docs/algorithm.md lists the keys that reproduce TRL.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from grpocli.algorithms.variants import (
    ADVANTAGES,
    KL_ESTIMATORS,
    LOSSES,
    described,
    loss_aliases,
)
from grpocli.recipe.bounds import MAX_ABS_REWARD
from grpocli.recipe.section import FREE_ON_RESUME, Section

#: Other names accepted for a loss (verl's loss_agg_mode names, where they coincide with ours).
LOSS_ALIASES = loss_aliases()
#: The names grpocli.algorithms.variants declares: one entry per variant.
LossName = Literal[tuple(LOSSES)]
AdvantageName = Literal[tuple(ADVANTAGES)]
KlName = Literal[tuple(KL_ESTIMATORS)]


def _loss_description() -> str:
    losses = "; ".join(f"{name}: {'clipped surrogate, ' if e.clipped else ''}{e.summary}" for name, e in LOSSES.items())
    return (f"The loss (TRL's loss_type): its per-token objective and how it is aggregated. {losses}. "
            f"verl names accepted: {', '.join(LOSS_ALIASES)}.")


class OverlongPenalty(Section):
    buffer_length: int = Field(
        0, ge=0, description="DAPO soft overlong punishment: length buffer in tokens (0: off)."
    )
    penalty: float = Field(
        1.0, ge=0.0, le=MAX_ABS_REWARD, description="Largest penalty, reached at the maximum length (it is added "
        "to the reward, so it has the rewards' bound)."
    )


class AlgorithmSection(Section):
    loss: LossName = Field("dapo", description=_loss_description())
    advantage_scale: AdvantageName = Field("group", description=f"Advantage estimator. {described(ADVANTAGES)}.")
    epsilon_low: float = Field(0.2, ge=0.0, le=10.0, description="Lower clip: ratio >= 1 - epsilon_low.")
    epsilon_high: float = Field(
        0.2, ge=0.0, le=10.0, description="Upper clip: ratio <= 1 + epsilon_high (DAPO: 0.28). For cispo "
        "the cap of the importance weight itself (ScaleRL recommends 5.0)."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="The importance ratio to the policy that generated: per token (PPO/GRPO, "
        "TRL's default) or one per sequence, the exp of the mean token log-ratio (GSPO; TRL 'sequence')."
    )
    delta: float | None = Field(
        None, gt=1.0, description="Two-sided clipping (INTELLECT-2, TRL's delta): cap the unclipped "
        "ratio at delta, bounding the loss of negative advantages (recommended > 1 + epsilon_high). "
        "None: off (TRL's default)."
    )
    clip_ratio_c: float | None = Field(
        None, gt=1.0, description="Dual clip (Dual-Clip PPO; verl's clip_ratio_c, 3.0 there): the loss of "
        "a negative advantage is at most -c x A. None: off (TRL, DeepSeekMath)."
    )
    num_iterations: int = Field(1, ge=1, le=64, description="Updates per generation batch (mu).")
    beta: float = Field(0.0, ge=0.0, description="KL coefficient; 0 loads no reference model.")
    kl_estimator: KlName = Field("k3", description=f"KL estimator. {described(KL_ESTIMATORS)}.")
    kl_importance_correction: bool = Field(
        False, description="Multiply the KL term by the importance ratio (TRL 1.16's "
        "use_bias_correction_kl, on by default there). false: the KL term as DeepSeekMath and verl add it."
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Entropy bonus: subtract coef x the mean token entropy of the step's "
        "loss tokens (verl's entropy_coeff, TRL's entropy_coef). 0: off."
    )
    top_entropy_quantile: float = Field(
        1.0, ge=0.0, le=1.0, description="Keep only the top quantile of tokens by entropy in the policy "
        "loss (Beyond the 80/20 Rule recommends 0.2; TRL's top_entropy_quantile), per micro-batch. 1: all."
    )
    sapo_temperature_pos: float = Field(1.0, gt=0.0, description="SAPO's gate temperature where A > 0 (TRL's default).")
    sapo_temperature_neg: float = Field(1.05, gt=0.0, description="SAPO's gate temperature where A <= 0 (TRL's default).")
    vespo_k_pos: float = Field(2.0, ge=0.0, description="VESPO's power k where A >= 0 (TRL's default).")
    vespo_lambda_pos: float = Field(3.0, ge=0.0, description="VESPO's decay lambda where A >= 0 (TRL's default).")
    vespo_k_neg: float = Field(3.0, ge=0.0, description="VESPO's power k where A < 0 (TRL's default).")
    vespo_lambda_neg: float = Field(2.0, ge=0.0, description="VESPO's decay lambda where A < 0 (TRL's default).")
    token_normalizer: Literal["step", "generation_batch"] = Field(
        "step", description="What the token-mean losses (dapo, cispo, vespo) divide by: 'step', the loss "
        "tokens of each optimizer step (verl's token-mean, open-instruct); 'generation_batch', the "
        "generation batch's loss tokens / steps_per_generation (TRL)."
    )
    ref_sync_steps: int = Field(0, ge=0, description="Refresh the reference model every N steps (0: never).")
    ref_sync_alpha: float = Field(
        1.0, ge=0.0, le=1.0, description="Refresh mix: ref = alpha * policy + (1 - alpha) * ref."
    )
    reference: Literal["local", "server"] = Field(
        "local", description="Where the reference model of the KL term (beta > 0) lives: 'local', a copy in "
        "every training process; 'server', a `grpo ref-serve --model <the policy's starting weights>` at "
        "reference_url that answers the reference log-probs (and mixes in the policy's weights at each "
        "ref_sync_steps refresh), so the training processes hold no reference model. Its API key, if any, "
        "is read from the environment variable GRPO_REF_API_KEY.",
        json_schema_extra=FREE_ON_RESUME,
    )
    reference_url: str = Field(
        "http://127.0.0.1:8001", min_length=1, description="URL of the `grpo ref-serve` (reference = 'server').",
        json_schema_extra=FREE_ON_RESUME,
    )
    reference_timeout: float = Field(
        300.0, gt=0.0, le=86400.0, description="Seconds each call to the reference server may take "
        "(reference = 'server'), and that a starting server is waited for; past it training stops with an error.",
        json_schema_extra=FREE_ON_RESUME,
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut at max_completion_length out of the loss (DAPO)."
    )
    truncated_rows: Literal["drop", "count"] = Field(
        "drop", description="With mask_truncated_completions: 'drop' takes a truncated row out of every "
        "count (open-instruct, verl); 'count' keeps it in the sequence counts with no loss token (TRL)."
    )
    overlong_penalty: OverlongPenalty = Field(default_factory=OverlongPenalty, description="DAPO's length penalty.")
    drop_zero_spread_groups: bool = Field(
        True, description="Leave whole groups whose rewards are all equal out of the loss and its "
        "normalisers (open-instruct, counted in real_batch_size_ratio). false: they stay in every "
        "count with advantage 0 and keep their KL term (TRL, verl)."
    )
    fill_batch: bool = Field(
        False, description="Keep sampling prompts until the batch has no zero-spread groups (DAPO)."
    )
    max_fill_rounds: int = Field(4, ge=1, le=64, description="Extra generation rounds fill_batch may take.")
    reward_combination: Literal["sum", "gated"] = Field(
        "sum",
        description="'sum': weighted sum of all rewards; 'gated': rewards without gate=true count "
        "only where every gate reward is > 0.",
    )

    @model_validator(mode="before")
    @classmethod
    def _verl_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("loss") in LOSS_ALIASES:
            data = {**data, "loss": LOSS_ALIASES[data["loss"]]}
        return data
