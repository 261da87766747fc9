"""[distill]: on-policy distillation from a teacher model. The student (the policy) samples, the
teacher scores every sampled token, and the learning signal is the per-token reverse KL to the teacher.
Declared here, wired into the recipe as ``distill``; the teacher is opened by grpocli.trainer.teacher and
its log-probs enter the loss in grpocli.trainer.step (docs/distillation.md says what each objective does)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from grpocli.algorithms.variants import KL_ESTIMATORS, described, names
from grpocli.recipe.section import Section

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

DistillObjective = Literal["reverse_kl", "reward_plus_kl"]


class DistillSection(Section):
    teacher: str | None = Field(
        None,
        description="The teacher: a model directory, a packaged or .gguf model (as model.name_or_path), a checkpoint "
        "(runs/NAME/checkpoints/step-N, LoRA adapters merged), a run directory (its newest intact checkpoint), or "
        "the http(s):// URL of a `grpo ref-serve` holding the teacher. Its tokenizer must be the student's (same "
        "vocabulary): the per-token signal compares the two models on the same token ids. None: no distillation.",
    )
    objective: DistillObjective = Field(
        "reverse_kl",
        description="'reverse_kl': on-policy distillation (Agarwal et al. 2024; Thinking Machines 2025): each "
        "completion token's advantage is coef x (teacher log-prob - student log-prob), the rewards are scored and "
        "logged but do not enter the loss; 'reward_plus_kl': GRPO's reward advantages as usual, plus coef x a "
        "per-token KL to the teacher (distill.kl_estimator) in the loss, as algorithm.beta adds one to the reference.",
    )
    coef: float = Field(
        1.0, gt=0.0, le=1000.0,
        description="'reverse_kl': the scale of the per-token advantage (the Thinking Machines post's "
        "kl_penalty_coef, 1.0); 'reward_plus_kl': the weight of the teacher KL term.",
    )
    kl_estimator: str = Field(
        "k2", json_schema_extra={"enum": names(KL_ESTIMATORS, where=lambda e: e.function is not None)},
        description="The teacher KL term of 'reward_plus_kl' (algorithm.kl_estimator's names: "
        f"{described(KL_ESTIMATORS)}). k2's gradient, taken through the loss on the student's own samples, is "
        "the reverse KL's (Tang and Munos 2025); k3's is the forward KL's; k1's is zero in expectation.",
    )
    timeout: float = Field(
        300.0, gt=0.0, le=86400.0,
        description="Seconds each call to a served teacher (an http(s):// distill.teacher) may take, and that a "
        "starting server is waited for; past it training stops with an error.",
    )

    @property
    def on(self) -> bool:
        return self.teacher is not None

    @property
    def served(self) -> bool:
        return self.teacher is not None and self.teacher.startswith(("http://", "https://"))


def check_distill(recipe: Recipe) -> None:
    """ValueError for [distill] settings that cannot work with the rest of the recipe (the schema reports it
    naming the keys, before any model loads)."""
    d = recipe.distill
    if not d.on:
        return
    if d.kl_estimator not in KL_ESTIMATORS or KL_ESTIMATORS[d.kl_estimator].function is None:
        raise ValueError(f"distill.kl_estimator = {d.kl_estimator!r} is not one of "
                         f"{', '.join(names(KL_ESTIMATORS, where=lambda e: e.function is not None))}")
    if d.objective == "reverse_kl" and recipe.algorithm.loss == "gmpo":
        raise ValueError("distill.objective = 'reverse_kl' gives every token its own advantage, and "
                         "algorithm.loss = 'gmpo' weighs one advantage per completion by its geometric-mean ratio; "
                         "valid: a token-level loss (dapo, grpo, dr_grpo, cispo, ...), or distill.objective = "
                         "'reward_plus_kl' with gmpo")


__all__ = ["DistillObjective", "DistillSection", "check_distill"]
