"""Sample N completions per prompt with any generation backend, score them, summarize.

Backend-agnostic: anything with ``generate(prompts, n, sampling) -> Generated``
(grpocli.generation.base) works, so `grpo eval` and evaluation during training share this.
Rewards are called exactly as in training (TRL's contract; grpocli.rewards.score); the
training-only overlong penalty is left out. A sample *succeeds* when its total reward (or
``success_reward``'s value) is >= ``success_threshold``; pass@k, mean@N and maj@N count those.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.evaluation.answers import extract_answer
from grpocli.evaluation.estimators import majority_at_n, mean_at_n, pass_at_k
from grpocli.recipe.bounds import MIN_TEMPERATURE
from grpocli.rewards import Scores, reward_metrics, score
from grpocli.rewards.failures import stop_past_masked_share

if TYPE_CHECKING:
    from grpocli.generation.base import GenerationBackend, Sampling
    from grpocli.recipe.eval_section import EvalSection
    from grpocli.recipe.schema import Recipe
    from grpocli.rewards import RewardFn


@dataclass(frozen=True)
class EvalSettings:
    """What to measure: N samples per prompt, the k of pass@k, and what counts as a success."""

    n: int
    k: tuple[int, ...] = (1,)
    success_threshold: float = 1.0
    success_reward: str | None = None

    @classmethod
    def from_section(cls, ev: EvalSection, *, n: int | None = None, k: Sequence[int] | None = None,
                     threshold: float | None = None) -> EvalSettings:
        """From an [eval] section (grpocli.recipe.eval_section), command-line values first."""
        return cls(
            n=n if n is not None else ev.n,
            k=tuple(sorted(set(k if k is not None else ev.k))),
            success_threshold=threshold if threshold is not None else ev.success_threshold,
            success_reward=ev.success_reward,
        )

    def check(self, reward_names: Sequence[str], where: str = "--k") -> None:
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise UserError(f"pass@k needs 1 <= k <= n = {self.n}, got k = {bad}", where=where,
                            valid=f"integers from 1 to {self.n}", hint=f"--k 1,{self.n} or a larger --n")
        if self.success_reward is not None and self.success_reward not in reward_names:
            raise UserError(f"success_reward {self.success_reward!r} is none of the recipe's rewards",
                            where="eval.success_reward", valid=", ".join(reward_names),
                            hint="use the name (or name#2 label) of a [[rewards]] entry")


def eval_sampling(recipe: Recipe, *, temperature: float | None = None, top_p: float | None = None,
                  max_tokens: int | None = None) -> Sampling:
    """The ``Sampling`` evaluation uses: [generation]'s, with [eval]'s temperature, top_p and
    max_tokens where set (None: the [generation] value), command-line values over both."""
    from dataclasses import replace

    from grpocli.generation.base import Sampling

    check_sampling_flags(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    ev = recipe.eval
    chosen = {"temperature": temperature if temperature is not None else ev.temperature,
              "top_p": top_p if top_p is not None else ev.top_p,
              "max_tokens": max_tokens if max_tokens is not None else ev.max_tokens}
    return replace(Sampling.from_section(recipe.generation), **{k: v for k, v in chosen.items() if v is not None})


def check_sampling_flags(*, temperature: float | None, top_p: float | None, max_tokens: int | None) -> None:
    """The bounds of [eval]'s keys, for the `grpo eval` flags that override them."""
    if temperature is not None and not MIN_TEMPERATURE <= temperature <= 10.0:
        raise UserError(f"--temperature {temperature:g} is out of range", where="--temperature",
                        valid=f"{MIN_TEMPERATURE} <= temperature <= 10", hint="--temperature 0.6")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise UserError(f"--top-p {top_p:g} is out of range", where="--top-p",
                        valid="0 < top_p <= 1", hint="--top-p 0.95")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens {max_tokens} is out of range", where="--max-tokens",
                        valid="an integer >= 1", hint="--max-tokens 512")


@dataclass
class EvalResult:
    samples: list[dict[str, Any]]       # [B*N] one record per completion, prompt-major
    metrics: dict[str, float | None] = field(default_factory=dict)


def sample_and_score(
    backend: GenerationBackend, tokenizer: Any, rows: list[dict[str, Any]], reward_fns: list[RewardFn],
    settings: EvalSettings, sampling: Sampling, *, prompt_column: str = "prompt", combination: str = "sum",
    indices: Sequence[int] | None = None, state: Any = None, turns: Any = None,
) -> list[dict[str, Any]]:
    """Records of N completions for each rendered row (rows carry ``prompt_text``), scored;
    ``state`` is the trainer_state rewards receive (TRL's keyword), what they log_extra lands
    in each record's ``extra``. No rows: no records; a lockstep backend (grpocli.generation.base)
    still makes its (empty) generate call, which the other processes' calls need. ``turns``: a
    multi-turn recipe's turn loop (grpocli.multiturn.turns.TurnLoop, as training samples): rewards get
    the conversations (and ``environments``), and each record its conversation, model turns and
    environment's ``get_metrics()``."""
    n = settings.n
    if not rows:
        if backend.lockstep:  # the other processes' generate calls need this one's
            turns.sample(backend, [], n, sampling) if turns is not None else backend.generate([], n, sampling)
        return []
    conversations = turns.sample(backend, rows, n, sampling) if turns is not None else None
    generated = (conversations.generated if conversations is not None
                 else backend.generate([row["prompt_text"] for row in rows], n, sampling))  # [B*N]
    completions = tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True)
    exclude = (prompt_column, "prompt_text")
    names = [k for k in rows[0] if k not in exclude]
    columns = {k: [row.get(k) for row in rows for _ in range(n)] for k in names}   # [B*N] each
    prompts = [row.get(prompt_column, row.get("prompt")) for row in rows for _ in range(n)]
    if conversations is not None and conversations.environments is not None:
        columns["environments"] = conversations.environments  # TRL's keyword, as in training
    scores = score(reward_fns, prompts, conversations.messages if conversations is not None else completions,
                   columns, combination, completion_ids=generated.completion_ids, state=state)
    stop_past_masked_share(reward_fns, scores, "in an evaluation batch")  # a masked sample's reward is None
    indices = list(indices) if indices is not None else list(range(len(rows)))
    records = []
    for i, text in enumerate(completions):
        row = rows[i // n]
        per = {name: values[i] for name, values in scores.per_reward.items()}
        judged = scores.total[i] if settings.success_reward is None else per[settings.success_reward]
        records.append({
            "prompt_index": indices[i // n], "sample": i % n, "prompt": row["prompt_text"],
            "completion": text, "rewards": per, "reward": scores.total[i],
            "success": judged is not None and judged >= settings.success_threshold,
            "answer": extract_answer(text), "length": len(generated.completion_ids[i]),
            "truncated": bool(generated.truncated[i]),
            "columns": {k: row.get(k) for k in names if k != "prompt"},
            **(_conversation(conversations, i) if conversations is not None else {}),
            **({"extra": {k: v[i] if i < len(v) else None for k, v in scores.logged.columns.items()}}
               if scores.logged.columns else {}),
        })
    return records


def _conversation(conversations: Any, i: int) -> dict[str, Any]:
    """A multi-turn record's own fields: the conversation, its model turns, the environment's metrics."""
    messages = conversations.messages[i]
    env = conversations.environments[i] if conversations.environments is not None else None
    method = getattr(env, "get_metrics", None)
    return {"conversation": messages, "turns": sum(1 for m in messages if m.get("role") == "assistant"),
            "env": {k: float(v) for k, v in (method() or {}).items()} if callable(method) else {}}


def summarize(samples: list[dict[str, Any]], settings: EvalSettings) -> dict[str, float | None]:
    """Mean reward, per-reward means, pass@k, mean@N, maj@N, length and truncation of the records."""
    if not samples:
        return {}
    groups: dict[int, list[dict[str, Any]]] = {}
    for s in samples:
        groups.setdefault(s["prompt_index"], []).append(s)
    totals = [float(s["reward"]) for s in samples]
    out: dict[str, float | None] = {
        "reward": statistics.fmean(totals),
        "reward_std": statistics.stdev(totals) if len(totals) > 1 else 0.0,
    }
    names = list(samples[0]["rewards"])
    per_reward = Scores({k: [s["rewards"][k] for s in samples] for k in names}, totals, {})
    out.update({k: v for k, v in reward_metrics(per_reward).items() if k.endswith("/mean")})
    successes = [[bool(s["success"]) for s in g] for g in groups.values()]
    for k in settings.k:
        out[f"pass@{k}"] = statistics.fmean(pass_at_k(len(g), sum(g), k) for g in successes)
    out[f"mean@{settings.n}"] = statistics.fmean(mean_at_n(g) for g in successes)
    votes = [majority_at_n([s["answer"] for s in g], [s["success"] for s in g]) for g in groups.values()]
    voted = [v for v in votes if v is not None]
    out[f"maj@{settings.n}"] = statistics.fmean(voted) if voted else None
    out["answer_rate"] = statistics.fmean(s["answer"] is not None for s in samples)
    out["completions/mean_length"] = statistics.fmean(s["length"] for s in samples)
    out["completions/clipped_ratio"] = statistics.fmean(bool(s["truncated"]) for s in samples)
    out["num_prompts"] = float(len(groups))
    if "turns" in samples[0]:  # multi-turn: model turns, and the environment's metrics (env/...)
        out["multi_turn/turns_per_rollout"] = statistics.fmean(s["turns"] for s in samples)
        for name in samples[0]["env"]:
            out[f"env/{name}"] = statistics.fmean(s["env"].get(name, 0.0) for s in samples)
    return out


def evaluate(
    backend: GenerationBackend, tokenizer: Any, rows: list[dict[str, Any]], reward_fns: list, settings: EvalSettings,
    sampling: Any, *, prompt_column: str = "prompt", combination: str = "sum",
) -> EvalResult:
    """Sample, score and summarize in one go (one process)."""
    samples = sample_and_score(backend, tokenizer, rows, reward_fns, settings, sampling,
                               prompt_column=prompt_column, combination=combination)
    return EvalResult(samples=samples, metrics=summarize(samples, settings))
