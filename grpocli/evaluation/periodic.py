"""Evaluation during training: every eval.every steps, on a held-out split, with the live model.

The training loop opens one `PeriodicEval` (it loads and renders this process's eval prompts
up front, so a wrong split fails before training starts), decides when one is due
(grpocli.trainer.session.is_due) and calls `run(step)` after it has synced weights to its
generation backend; the returned ``eval/...`` metrics go into metrics.jsonl and the samples
into eval/step-N-<split>/. Under several processes each samples its share of the prompts and
the records are gathered before summarizing; the shares may differ by a prompt (or be empty), so
a lockstep backend (the 'hf' backend under FSDP2) evens the number of generate calls
(grpocli.generation.hf). Sampling runs under ``torch.random.fork_rng``
seeded by train.seed + step, so evaluating does not change the training run's random stream.
It samples with [eval]'s temperature, top_p and max_tokens where set, else [generation]'s.

A [[data.sources]] mixture is evaluated source by source (`SourcesEval`): each source a PeriodicEval of
the recipe as that source alone (its dataset, args and prompt keys; the split its ``eval_split`` names, else
eval.split, else data.eval_split, else 'test'), scored by the rewards that score the source (eval.success_reward
judges the sources it scores, the others by their total reward). Each source's metrics are logged as
``eval/<source>/...`` and its samples written to eval/step-N-<source>-<split>/; ``eval/...`` without a source
summarizes every source's samples together.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.evaluation.evaluator import (
    EvalSettings,
    eval_sampling,
    sample_and_score,
    summarize,
)
from grpocli.evaluation.records import eval_dir, write_eval
from grpocli.parallel import Parallel
from grpocli.recipe.data_sources import reward_indices
from grpocli.rewards import RewardFn

if TYPE_CHECKING:
    from grpocli.generation.base import GenerationBackend, Sampling
    from grpocli.recipe.data_sources import DataSource
    from grpocli.recipe.schema import Recipe
    from grpocli.registry import Registry


@dataclass
class PeriodicEval:
    recipe: Recipe
    tokenizer: Any
    backend: GenerationBackend  # the training run's generation backend
    reward_fns: list[RewardFn]
    parallel: Parallel        # the training processes (Parallel.alone(): one)
    run_root: Path | None     # where eval/step-N-<split>/ is written (None: nowhere)
    rows: list[dict[str, Any]]  # this process's rendered eval prompts
    indices: list[int]        # their indices in the split
    turns: Any = None         # a multi-turn recipe's turn loop (grpocli.multiturn.turns.TurnLoop), else None

    @property
    def every(self) -> int:
        return self.recipe.eval.every

    @property
    def split(self) -> str:
        return self.recipe.eval.split_for(self.recipe.data.eval_split)

    @classmethod
    def open(cls, recipe: Recipe, *, tokenizer: Any, backend: GenerationBackend, reward_fns: list[RewardFn],
             parallel: Parallel, run_root: Path | None, turns: Any = None,
             datasets: Registry | None = None) -> PeriodicEval | None:
        """Load and render this process's eval prompts; None when eval.every is 0. ``turns``: the
        training run's turn loop, so that a multi-turn recipe is evaluated as it trains; ``datasets``:
        the run's dataset loaders (the plugins it loaded; None: loaded here)."""
        ev = recipe.eval
        if not ev.every:
            return None
        if recipe.data.sources:  # each source's eval split, eval/<source>/... (SourcesEval, below)
            return SourcesEval.open(recipe, tokenizer=tokenizer, backend=backend, reward_fns=reward_fns,  # type: ignore[return-value]
                                    parallel=parallel, run_root=run_root, turns=turns, datasets=datasets)
        EvalSettings.from_section(ev).check([f.name for f in reward_fns], where="eval.k")
        check_engine_length(recipe, eval_sampling(recipe))
        from grpocli.data.source import load_dataset_for
        from grpocli.data.template import RenderedPrompts
        from grpocli.registry import load_plugins

        split = ev.split_for(recipe.data.eval_split)
        datasets = datasets if datasets is not None else load_plugins().datasets
        dataset = load_dataset_for(recipe.data, datasets, split, recipe.train.seed)
        count = len(dataset) if ev.num_prompts == 0 else min(ev.num_prompts, len(dataset))
        indices = list(range(count))[parallel.rank::parallel.size]
        prompts = RenderedPrompts(dataset, recipe.data, tokenizer)
        return cls(recipe, tokenizer, backend, reward_fns, parallel, run_root,
                   [prompts[i] for i in indices], indices, turns)

    def run(self, step: int) -> dict[str, float]:
        """``{"eval/reward": ..., "eval/pass@1": ..., "time/eval": ...}`` for the model at ``step``."""
        r = self.recipe
        settings = EvalSettings.from_section(r.eval)
        sampling = eval_sampling(r)
        t0 = time.perf_counter()
        samples = self.collect(step, settings, sampling)
        metrics = summarize(samples, settings)
        seconds = time.perf_counter() - t0
        self.write(step, samples, settings, sampling, metrics)
        out = {f"eval/{k}": float(v) for k, v in metrics.items() if v is not None}
        out["time/eval"] = seconds
        return out

    def collect(self, step: int, settings: EvalSettings, sampling: Any) -> list[dict]:
        """Every process's scored samples of the model at ``step`` (each process samples its share)."""
        return self._gather(self._sample(settings, sampling, seed=self.recipe.train.seed + step, step=step))

    def write(self, step: int, samples: list[dict], settings: EvalSettings, sampling: Any, metrics: dict[str, Any],
              name: str | None = None) -> None:
        """eval/step-N-<split>/ (a mixture's source: eval/step-N-<name>-<split>/), from the main process."""
        if self.parallel.main and self.run_root is not None:
            summary = {"label": f"step-{step}", "step": step, "split": self.split, "n": settings.n,
                       "k": list(settings.k), "success_threshold": settings.success_threshold,
                       "success_reward": settings.success_reward, "sampling": asdict(sampling),
                       "metrics": metrics, **({"source": name} if name else {})}
            split = f"{name}-{self.split}" if name else self.split
            write_eval(eval_dir(Path(self.run_root) / "eval", f"step-{step}", split), samples, summary)

    def _sample(self, settings: EvalSettings, sampling: Any, *, seed: int, step: int) -> list[dict]:
        import torch

        from grpocli.rewards.scoring import trainer_state

        r = self.recipe
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return sample_and_score(self.backend, self.tokenizer, self.rows, self.reward_fns, settings,
                                    sampling, prompt_column=r.data.prompt_column,
                                    combination=r.algorithm.reward_combination, indices=self.indices,
                                    state=trainer_state(global_step=step, max_steps=r.train.steps),
                                    turns=self.turns)

    def _gather(self, samples: list[dict]) -> list[dict]:
        if self.parallel.size == 1:
            return samples
        return sorted(self.parallel.gather_rows(samples), key=lambda s: (s["prompt_index"], s["sample"]))


# -- [[data.sources]]: each source on its own eval split -------------------------------------
def source_recipe(recipe: Recipe, source: DataSource, reward_names: list[str]) -> Recipe:
    """``recipe`` as ``source`` alone, for evaluation: its data section, its eval split, and
    eval.success_reward only where one of ``reward_names`` (the rewards that score it)."""
    split = source.eval_split or recipe.eval.split_for(recipe.data.eval_split)
    success = recipe.eval.success_reward if recipe.eval.success_reward in reward_names else None
    ev = recipe.eval.model_copy(update={"split": split, "success_reward": success})
    return recipe.model_copy(update={"data": source.section(recipe.data), "eval": ev})


@dataclass
class SourcesEval:
    """What the training loop asks of a PeriodicEval (``every``, ``run``), over every source."""

    recipe: Recipe
    parts: list[tuple[str, PeriodicEval]]  # (source name, its evaluation)

    @property
    def every(self) -> int:
        return self.recipe.eval.every

    @classmethod
    def open(cls, recipe: Recipe, *, tokenizer: Any, backend: GenerationBackend, reward_fns: list[RewardFn],
             parallel: Parallel, run_root: Path | None, turns: Any = None,
             datasets: Registry | None = None) -> SourcesEval:
        """Load and render each source's eval prompts (this process's share); a source whose split fails is named."""
        from grpocli.data.source import in_source

        EvalSettings.from_section(recipe.eval).check([f.name for f in reward_fns], where="eval.k")
        names, labels = [spec.name for spec in recipe.rewards], [rf.name for rf in reward_fns]
        parts = []
        for i, source in enumerate(recipe.data.sources):
            fns = [reward_fns[k] for k in reward_indices(source, names, labels)]
            sub = source_recipe(recipe, source, [f.name for f in fns])
            try:
                part = PeriodicEval.open(sub, tokenizer=tokenizer, backend=backend, reward_fns=fns, parallel=parallel,
                                         run_root=run_root, turns=turns, datasets=datasets)
            except UserError as exc:
                raise in_source(exc, i, source.label) from None
            assert part is not None  # eval.every is set
            parts.append((source.label, part))
        return cls(recipe, parts)

    def run(self, step: int) -> dict[str, float]:
        """``eval/<source>/...`` for each source and ``eval/...`` over them all, for the model at ``step``."""
        sampling = eval_sampling(self.recipe)
        t0 = time.perf_counter()
        out: dict[str, float] = {}
        every: list[dict[str, Any]] = []
        for name, part in self.parts:
            settings = EvalSettings.from_section(part.recipe.eval)
            samples = part.collect(step, settings, sampling)
            metrics = summarize(samples, settings)
            part.write(step, samples, settings, sampling, metrics, name=name)
            out.update({f"eval/{name}/{k}": float(v) for k, v in metrics.items() if v is not None})
            every += [{**s, "prompt_index": (name, s["prompt_index"])} for s in samples]
        together = summarize(_every_reward(every), EvalSettings.from_section(self.recipe.eval))
        out.update({f"eval/{k}": float(v) for k, v in together.items() if v is not None})
        out["time/eval"] = time.perf_counter() - t0
        return out


def _every_reward(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples with every reward any of them has (None where a reward does not score a sample's source)."""
    names = list(dict.fromkeys(name for s in samples for name in s["rewards"]))
    return [{**s, "rewards": {name: s["rewards"].get(name) for name in names}} for s in samples]


def check_engine_length(recipe: Recipe, sampling: Sampling) -> None:
    """The colocated vLLM engine holds data.max_prompt_length + generation.max_completion_length
    tokens (unless vllm.max_model_len says otherwise): longer eval completions do not fit."""
    if recipe.generation.backend != "vllm":
        return
    need = recipe.data.max_prompt_length + sampling.max_tokens
    have = recipe.vllm.max_model_len or recipe.data.max_prompt_length + recipe.generation.max_completion_length
    if need > have:
        raise UserError(
            f"eval.max_tokens = {sampling.max_tokens} does not fit the colocated vLLM engine, which holds "
            f"{have} tokens (prompt + completion)", where="eval.max_tokens",
            valid=f"eval.max_tokens <= {have - recipe.data.max_prompt_length}, or vllm.max_model_len >= {need}",
            hint=f"vllm.max_model_len={need}")
