"""The [eval] section: how `grpo eval` and evaluation during training sample and judge.

Wired into ``Recipe`` by grpocli.recipe.schema as ``eval: EvalSection``.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from grpocli.recipe.bounds import MIN_TEMPERATURE
from grpocli.recipe.section import Section


class EvalSection(Section):
    every: int = Field(
        0, ge=0, description="Evaluate every N training steps on a held-out split, logged as "
        "eval/... in metrics.jsonl (0: off)."
    )
    on_start: bool = Field(
        False, description="With eval.every, evaluate once before the first step too (TRL's eval_on_start): "
        "the base model's eval/... at step 0, the start of the curve."
    )
    split: str | None = Field(
        None, description="Split to evaluate on (default: data.eval_split, else 'test')."
    )
    n: int = Field(8, ge=1, le=1024, description="Samples per prompt (the N of mean@N and maj@N).")
    k: list[int] = Field(
        default_factory=lambda: [1], description="k values of pass@k (each <= n)."
    )
    num_prompts: int = Field(
        64, ge=0, description="Evaluate the first N prompts of the split (0: all of them)."
    )
    success_threshold: float = Field(
        1.0, description="A sample succeeds when its reward (total, or success_reward's) is >= this."
    )
    success_reward: str | None = Field(
        None, description="Judge success by this reward's value instead of the weighted total."
    )
    temperature: float | None = Field(
        None, ge=MIN_TEMPERATURE, le=10.0,
        description="Sampling temperature of evaluation (default: generation.temperature)."
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="Nucleus sampling threshold of evaluation (default: generation.top_p)."
    )
    max_tokens: int | None = Field(
        None, ge=1, le=131072, description="Longest evaluated completion in tokens (default: "
        "generation.max_completion_length)."
    )
    reward_probes_every: int = Field(
        50, ge=0, description="Every N training steps, score the `grpo check-rewards` probes of the step's first "
        "eval.reward_probes_rows prompts beside the policy's own completions of them, and warn (once per reward "
        "and kind) when a reward pays for length or the format alone (0: off)."
    )
    reward_probes_rows: int = Field(
        4, ge=1, le=64, description="Prompts of the step that eval.reward_probes_every probes."
    )
    output_dir: str | None = Field(
        None, description="Where `grpo eval` writes samples and summaries (default: the run's eval/)."
    )

    def split_for(self, data_eval_split: str | None, override: str | None = None) -> str:
        """The split to evaluate on: ``override`` (--split), else eval.split, else data.eval_split, else 'test'."""
        return override or self.split or data_eval_split or "test"

    @field_validator("k")
    @classmethod
    def _positive_k(cls, k: list[int]) -> list[int]:
        if not k or any(v < 1 for v in k):
            raise ValueError(f"k must be a non-empty list of integers >= 1, got {k}")
        return sorted(set(k))

    @model_validator(mode="after")
    def _k_at_most_n(self) -> EvalSection:
        if max(self.k) > self.n:
            raise ValueError(f"every k of pass@k must be <= n = {self.n}, got k = {self.k}")
        return self
