"""`grpo eval RECIPE`: sample with the recipe's backend, score with its rewards, compare models.

The backend comes from the same table as training's (grpocli.generation.backends.BACKENDS), so
`grpo eval` samples with transformers, a colocated vLLM engine or a vLLM server (`grpo vllm-serve`).

Names (rewards, dataset, split, k) and checkpoints are checked before any model loads. Each
model samples from the same prompts with the same seed (train.seed), so a checkpoint and the
base model are compared on equal terms, with [eval]'s sampling (temperature, top_p, max_tokens;
unset: [generation]'s) or the command line's. A LoRA checkpoint (adapters only) is loaded onto
its base model and merged (grpocli.models.export).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from grpocli.errors import UserError
from grpocli.evaluation.evaluator import EvalSettings, eval_sampling, evaluate
from grpocli.evaluation.records import check_writable, eval_dir, write_eval
from grpocli.evaluation.report import comparison_table
from grpocli.evaluation.targets import Target, resolve_targets, while_reading
from grpocli.models.export import (
    CheckpointModel,
    checkpoint_model,
    is_adapter,
    open_model,
)

if TYPE_CHECKING:
    from grpocli.generation.base import Sampling
    from grpocli.recipe import Recipe, Resolved
    from grpocli.recipe.schema import ModelSection
    from grpocli.rewards import RewardFn


def parse_k(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(f"cannot read --k {text!r}", where="--k",
                        valid="comma-separated integers >= 1, e.g. 1,4,8", hint="--k 1,4,8")
    return values


def run_eval(
    recipe: str, overrides: list[str], *, checkpoints: list[str], split: str | None = None,
    n: int | None = None, k: str | None = None, base: bool = False, num_prompts: int | None = None,
    threshold: float | None = None, output_dir: str | None = None, temperature: float | None = None,
    top_p: float | None = None, max_tokens: int | None = None, console: Console | None = None,
) -> dict[str, dict[str, Any]]:
    """Evaluate the base model and/or checkpoints; print one table; return {label: summary}."""
    from grpocli.data.source import load_dataset_for
    from grpocli.generation.positions import check_eval_positions
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    console = console or Console(highlight=False, soft_wrap=True)
    notes = Console(stderr=True, highlight=False, soft_wrap=True)
    resolved = load_recipe(recipe, overrides)
    r = resolved.recipe
    ev = r.eval
    settings = EvalSettings.from_section(ev, n=n, k=parse_k(k), threshold=threshold)
    sampling = eval_sampling(r, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    targets = resolve_targets(checkpoints, base=base)
    models = {t.label: model_for(r, t) for t in targets}  # an adapter without a base fails here
    key = "--max-tokens" if max_tokens is not None else "eval.max_tokens" if ev.max_tokens is not None else \
        "generation.max_completion_length"
    for model in models.values():  # prompt + completion past a model's positions: exit 2 before it loads
        check_eval_positions(r, model.section, key, sampling.max_tokens)
    plugins = load_plugins()
    reward_fns = resolve(r.rewards, plugins.rewards)
    settings.check([f.name for f in reward_fns])
    if r.data.sources:  # each source on its own eval split, with its own rewards
        return _run_sources(resolved, targets, models, plugins, reward_fns, settings, sampling, split=split,
                            num_prompts=num_prompts, output_dir=output_dir, console=console, notes=notes)
    split = ev.split_for(r.data.eval_split, split)
    dataset = load_dataset_for(r.data, plugins.datasets, split, r.train.seed)
    count = num_prompts if num_prompts is not None else ev.num_prompts
    count = len(dataset) if count in (0, None) else min(count, len(dataset))
    root = _eval_root(output_dir or ev.output_dir, targets, resolved)
    check_writable(root, "--output-dir" if output_dir else "eval.output_dir" if ev.output_dir else
                   "--output-dir (default: the run's eval/)")
    if r.tools or r.multi_turn.environment:  # evaluation is single-turn: say so, not silently
        notes.print("note: the recipe trains with tools ([[tools]] / multi_turn.environment); grpo eval "
                    "samples single-turn completions without them, so its scores are of answers written "
                    "without tool calls")
    summaries: dict[str, dict[str, Any]] = {}
    for target in targets:
        for note in (target.note, models[target.label].note):
            if note:
                notes.print(f"note: {note}")
        notes.print(f"evaluating {target.label} on {count} prompts of split {split!r} x {settings.n} samples")
        summary = _evaluate_one(target, models[target.label], r, dataset, count, reward_fns, settings, sampling)
        summary.update(recipe=resolved.name, recipe_path=str(resolved.path or ""), split=split)
        out = write_eval(eval_dir(root, target.label, split), summary.pop("samples"), summary)
        notes.print(f"wrote {out}/samples.jsonl and summary.json")
        summaries[target.label] = summary
    title = (f"grpo eval {resolved.name}: split {split!r}, {count} prompts x {settings.n} samples, "
             f"success: {settings.success_reward or 'reward'} >= {settings.success_threshold:g}")
    console.print(comparison_table({label: s["metrics"] for label, s in summaries.items()}, title=title))
    return summaries


def _run_sources(resolved: Resolved, targets: list[Target], models: dict[str, CheckpointModel], plugins: Any,
                 reward_fns: list[RewardFn], settings: EvalSettings, sampling: Sampling, *, split: str | None,
                 num_prompts: int | None, output_dir: str | None, console: Console,
                 notes: Console) -> dict[str, dict[str, Any]]:
    """`grpo eval` of a [[data.sources]] mixture: each source's eval split (``split``, --split, for every source)
    scored by its own rewards (grpocli.evaluation.periodic.source_recipe), written to eval/<label>-<source>-<split>/;
    one table of ``<source>/<metric>``; {label: {"metrics": ..., "sources": {source: summary}}}."""
    from grpocli.data.source import load_source
    from grpocli.evaluation.periodic import source_recipe
    from grpocli.recipe.data_sources import reward_indices

    r = resolved.recipe
    names, labels = [spec.name for spec in r.rewards], [rf.name for rf in reward_fns]
    parts = []
    for i, source in enumerate(r.data.sources):  # every split loads before any model does
        fns = [reward_fns[k] for k in reward_indices(source, names, labels)]
        sub = source_recipe(r, source, [f.name for f in fns])
        chosen = split or sub.eval.split
        dataset = load_source(r.data, i, plugins.datasets, chosen, r.train.seed)
        wanted = num_prompts if num_prompts is not None else r.eval.num_prompts
        count = len(dataset) if wanted in (0, None) else min(wanted, len(dataset))
        parts.append((source.label, sub, dataset, count, fns, replace(settings, success_reward=sub.eval.success_reward),
                      chosen))
    root = _eval_root(output_dir or r.eval.output_dir, targets, resolved)
    check_writable(root, "--output-dir" if output_dir else "eval.output_dir" if r.eval.output_dir else
                   "--output-dir (default: the run's eval/)")
    summaries: dict[str, dict[str, Any]] = {}
    for target in targets:
        for note in (target.note, models[target.label].note):
            if note:
                notes.print(f"note: {note}")
        per_source, metrics = {}, {}
        for name, sub, dataset, count, fns, own, chosen in parts:
            notes.print(f"evaluating {target.label} on {count} prompts of source {name!r}, split {chosen!r} x "
                        f"{settings.n} samples")
            summary = _evaluate_one(target, models[target.label], sub, dataset, count, fns, own, sampling)
            summary.update(recipe=resolved.name, recipe_path=str(resolved.path or ""), split=chosen, source=name)
            out = write_eval(eval_dir(root, target.label, f"{name}-{chosen}"), summary.pop("samples"), summary)
            notes.print(f"wrote {out}/samples.jsonl and summary.json")
            per_source[name] = summary
            metrics.update({f"{name}/{k}": v for k, v in summary["metrics"].items()})
        summaries[target.label] = {"label": target.label, "metrics": metrics, "sources": per_source}
    said = ", ".join(f"{name} ({chosen!r}, {count} prompts)" for name, _, _, count, _, _, chosen in parts)
    title = (f"grpo eval {resolved.name}: sources {said} x {settings.n} samples, success: "
             f"{settings.success_reward or 'reward'} >= {settings.success_threshold:g} (a source's total reward where "
             "success_reward does not score it)")
    console.print(comparison_table({label: s["metrics"] for label, s in summaries.items()}, title=title))
    return summaries


def _evaluate_one(target: Target, model: CheckpointModel, r: Recipe, dataset: Any, count: int,
                  reward_fns: list[RewardFn], settings: EvalSettings, sampling: Sampling) -> dict[str, Any]:
    from transformers import set_seed

    from grpocli.data.template import RenderedPrompts

    tokenizer, backend = _open_checked(target, model, r, sampling)
    try:
        prompts = RenderedPrompts(dataset, r.data, tokenizer)
        rows = [prompts[i] for i in range(count)]
        set_seed(r.train.seed)  # every model samples from the same random stream
        t0 = time.perf_counter()
        result = evaluate(backend, tokenizer, rows, reward_fns, settings, sampling,
                          prompt_column=r.data.prompt_column, combination=r.algorithm.reward_combination)
    finally:
        backend.close()
    return {
        "model": str(target.path) if target.path else model.section.name_or_path,
        **({"base_model": model.section.name_or_path} if model.adapter else {}),
        "label": target.label, "n": settings.n, "k": list(settings.k),
        "success_threshold": settings.success_threshold, "success_reward": settings.success_reward,
        "seed": r.train.seed, "sampling": asdict(sampling),
        "seconds": round(time.perf_counter() - t0, 3), "metrics": result.metrics, "samples": result.samples,
    }


def model_for(r: Recipe, target: Target) -> CheckpointModel:
    """What to load for ``target``: the recipe's model, a checkpoint, or LoRA adapters on their base."""
    if target.path is not None and is_adapter(target.path):
        return checkpoint_model(target.path, model=r.model, seed=r.train.seed)
    return CheckpointModel(model_section_for(r.model, target), r.train.seed)


def model_section_for(model: ModelSection, target: Target) -> ModelSection:
    """The recipe's [model] for the base; for a checkpoint its directory and its saved tokenizer
    (else the base model's), without fresh LoRA adapters or gradient checkpointing; for LoRA
    adapters their base model's section (grpocli.models.export.checkpoint_model)."""
    if target.path is None:
        return model.model_copy(update={"gradient_checkpointing": False,
                                        "lora": model.lora.model_copy(update={"enabled": False})})
    return checkpoint_model(target.path, model=model).section


def _open_checked(target: Target, model: CheckpointModel, r: Recipe, sampling: Sampling) -> tuple[Any, Any]:
    """`open_backend`, where a checkpoint that vanished since it was chosen is said to be gone."""
    with while_reading(target, "grpo eval", "--checkpoint"):
        return open_backend(model, r, sampling)


def open_backend(model: CheckpointModel, r: Recipe, sampling: Sampling) -> tuple[Any, Any]:
    """The model (adapters merged) and the recipe's generation backend around it, made to hold
    completions of ``sampling.max_tokens``."""
    import torch

    from grpocli.generation.backends import build_backend
    from grpocli.models import load_tokenizer

    tokenizer = load_tokenizer(model.section)
    device = "cuda" if torch.cuda.is_available() and r.generation.backend in ("hf", "paged") else None
    policy = open_model(model, device=device)
    longest = max(r.generation.max_completion_length, sampling.max_tokens)
    r = r.model_copy(update={"generation": r.generation.model_copy(update={"max_completion_length": longest})})
    return tokenizer, build_backend(policy, tokenizer, r, seed=r.train.seed)


def _eval_root(configured: str | None, targets: list[Target], resolved: Resolved) -> Path:
    if configured:
        return resolved.cwd / Path(configured.replace("{recipe}", resolved.name)).expanduser()
    for target in targets:
        if target.run_root is not None:
            return target.run_root / "eval"
    return resolved.output_dir() / "eval"
