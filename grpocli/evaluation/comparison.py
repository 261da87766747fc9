"""`grpo eval RECIPE`: sample with the recipe's backend, score with its rewards, compare models.

The backend comes from the same table as training's (grpocli.generation.backends.BACKENDS), so
`grpo eval` samples with transformers, a colocated vLLM engine or a `grpo vllm-serve` server.

Names (rewards, dataset, split, k) and checkpoints are checked before any model loads. Each
model samples from the same prompts with the same seed (train.seed), so a checkpoint and the
base model are compared on equal terms.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from grpocli.errors import UserError
from grpocli.evaluation.evaluator import EvalSettings, evaluate
from grpocli.evaluation.records import eval_dir, write_eval
from grpocli.evaluation.report import comparison_table
from grpocli.evaluation.targets import Target, resolve_targets


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
    threshold: float | None = None, output_dir: str | None = None, console: Console | None = None,
) -> dict[str, dict[str, Any]]:
    """Evaluate the base model and/or checkpoints; print one table; return {label: summary}."""
    from grpocli.data.source import load_dataset_for
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    console = console or Console(highlight=False, soft_wrap=True)
    notes = Console(stderr=True, highlight=False, soft_wrap=True)
    resolved = load_recipe(recipe, overrides)
    r = resolved.recipe
    ev = r.eval
    settings = EvalSettings.from_section(ev, n=n, k=parse_k(k), threshold=threshold)
    targets = resolve_targets(checkpoints, base=base)
    plugins = load_plugins()
    reward_fns = resolve(r.rewards, plugins.rewards)
    settings.check([f.name for f in reward_fns])
    split = ev.split_for(r.data.eval_split, split)
    dataset = load_dataset_for(r.data, plugins.datasets, split, r.train.seed)
    count = num_prompts if num_prompts is not None else ev.num_prompts
    count = len(dataset) if count in (0, None) else min(count, len(dataset))
    root = _eval_root(output_dir or ev.output_dir, targets, resolved)
    summaries: dict[str, dict[str, Any]] = {}
    for target in targets:
        if target.note:
            notes.print(f"note: {target.note}")
        notes.print(f"evaluating {target.label} on {count} prompts of split {split!r} x {settings.n} samples")
        summary = _evaluate_one(target, r, dataset, count, reward_fns, settings)
        summary.update(recipe=resolved.name, recipe_path=str(resolved.path or ""), split=split)
        out = write_eval(eval_dir(root, target.label, split), summary.pop("samples"), summary)
        notes.print(f"wrote {out}/samples.jsonl and summary.json")
        summaries[target.label] = summary
    title = (f"grpo eval {resolved.name}: split {split!r}, {count} prompts x {settings.n} samples, "
             f"success: {settings.success_reward or 'reward'} >= {settings.success_threshold:g}")
    console.print(comparison_table({label: s["metrics"] for label, s in summaries.items()}, title=title))
    return summaries


def _evaluate_one(target: Target, r: Any, dataset: Any, count: int,
                  reward_fns: list, settings: EvalSettings) -> dict[str, Any]:
    from transformers import set_seed

    from grpocli.data.template import RenderedPrompts
    from grpocli.generation.base import Sampling

    model_section = model_section_for(r.model, target)
    tokenizer, backend = _open_backend(model_section, r)
    try:
        prompts = RenderedPrompts(dataset, r.data, tokenizer)
        rows = [prompts[i] for i in range(count)]
        sampling = Sampling.from_section(r.generation)
        set_seed(r.train.seed)  # every model samples from the same random stream
        t0 = time.perf_counter()
        result = evaluate(backend, tokenizer, rows, reward_fns, settings, sampling,
                          prompt_column=r.data.prompt_column, combination=r.algorithm.reward_combination)
    finally:
        backend.close()
    return {
        "model": str(target.path) if target.path else model_section.name_or_path,
        "label": target.label, "n": settings.n, "k": list(settings.k),
        "success_threshold": settings.success_threshold, "success_reward": settings.success_reward,
        "seed": r.train.seed, "sampling": asdict(sampling),
        "seconds": round(time.perf_counter() - t0, 3), "metrics": result.metrics, "samples": result.samples,
    }


def model_section_for(model: Any, target: Target) -> Any:
    """The recipe's [model] for the base; for a checkpoint its directory and its saved tokenizer
    (else the base model's), without fresh LoRA adapters or gradient checkpointing."""
    update: dict[str, Any] = {"gradient_checkpointing": False,
                              "lora": model.lora.model_copy(update={"enabled": False})}
    if target.path is not None:
        update["name_or_path"] = str(target.path)
        has_tokenizer = (target.path / "tokenizer_config.json").exists()
        update["tokenizer"] = None if has_tokenizer else (model.tokenizer or model.name_or_path)
    return model.model_copy(update=update)


def _open_backend(model_section: Any, r: Any) -> tuple[Any, Any]:
    """The model of ``model_section`` and the recipe's generation backend around it."""
    import torch

    from grpocli.generation.backends import build_backend
    from grpocli.models import load_policy, load_tokenizer

    tokenizer = load_tokenizer(model_section)
    device = "cuda" if torch.cuda.is_available() and r.generation.backend == "hf" else None
    model = load_policy(model_section, r.train.seed, device=device)
    model.eval()
    return tokenizer, build_backend(model, tokenizer, r, seed=r.train.seed)


def _eval_root(configured: str | None, targets: list[Target], resolved: Any) -> Path:
    if configured:
        return Path(configured.replace("{recipe}", resolved.name))
    for target in targets:
        if target.run_root is not None:
            return target.run_root / "eval"
    return resolved.output_dir() / "eval"
