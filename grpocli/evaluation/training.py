"""Evaluation during training: every eval.every steps, on a held-out split, with the live model.

The training loop calls ``evaluate_during_training(session, step, since=...)`` after it has
synced weights to its generation backend; the returned ``eval/...`` metrics go into
metrics.jsonl. The eval prompts are loaded and rendered once per session (``prepare_evaluation``
does it up front so a wrong split fails before training starts). Under several processes each
samples its share of the prompts and the records are gathered before summarizing. Sampling
runs under ``torch.random.fork_rng`` seeded by train.seed + step, so evaluating does not change
the training run's random stream.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from grpocli.evaluation.evaluator import EvalSettings, sample_and_score, summarize
from grpocli.evaluation.records import eval_dir, write_eval
from grpocli.evaluation.run import eval_section, eval_split

_PROMPTS: dict[int, tuple[Any, list[dict[str, Any]], list[int]]] = {}


def is_due(every: int, step: int, since: int | None = None) -> bool:
    """True when a multiple of ``every`` lies in (since, step] (or, without since, step is one)."""
    if every <= 0:
        return False
    if since is None:
        return step % every == 0
    return step // every > since // every


def prepare_evaluation(session_like: Any) -> None:
    """Load and render this process's eval prompts now (no-op when eval.every is 0)."""
    if eval_section(session_like.recipe).every:
        _my_prompts(session_like)


def evaluate_during_training(session_like: Any, step: int, *, since: int | None = None) -> dict[str, float]:
    """``{"eval/reward": ..., "eval/pass@1": ..., ...}`` when an evaluation is due at ``step``, else {}.

    ``session_like`` needs: recipe, tokenizer, backend (generate), reward_fns, accelerator (or
    None for one process) and run (a RunDir, where eval/step-N-<split>/ samples are written).
    ``since``: the step of the previous call, so that steps_per_generation > 1 misses no multiple.
    """
    r = session_like.recipe
    ev = eval_section(r)
    if not is_due(ev.every, step, since):
        return {}
    settings = EvalSettings.from_section(ev)
    settings.check([f.name for f in session_like.reward_fns], where="eval.k")
    rows, indices = _my_prompts(session_like)
    t0 = time.perf_counter()
    samples = _sample(session_like, rows, indices, settings, seed=r.train.seed + step)
    samples = _gather(session_like.accelerator, samples)
    metrics = summarize(samples, settings)
    seconds = time.perf_counter() - t0
    if _is_main(session_like.accelerator) and getattr(session_like, "run", None) is not None:
        summary = {"label": f"step-{step}", "step": step, "split": eval_split(r), "n": settings.n,
                   "k": list(settings.k), "success_threshold": settings.success_threshold,
                   "success_reward": settings.success_reward, "metrics": metrics}
        write_eval(eval_dir(session_like.run.root / "eval", f"step-{step}", eval_split(r)), samples, summary)
    out = {f"eval/{k}": float(v) for k, v in metrics.items() if v is not None}
    out["time/eval"] = seconds
    return out


def _sample(s: Any, rows: list, indices: list[int], settings: EvalSettings, *, seed: int) -> list[dict]:
    import torch

    from grpocli.generation.base import Sampling

    r = s.recipe
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return sample_and_score(s.backend, s.tokenizer, rows, s.reward_fns, settings,
                                Sampling.from_section(r.generation), prompt_column=r.data.prompt_column,
                                combination=r.algorithm.reward_combination, indices=indices)


def _my_prompts(s: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """This process's share of the first eval.num_prompts rendered rows (cached per session)."""
    cached = _PROMPTS.get(id(s))
    if cached is not None and cached[0]() is s:
        return cached[1], cached[2]
    from grpocli.data.source import load_dataset_for
    from grpocli.data.template import RenderedPrompts
    from grpocli.registry import load_plugins

    r = s.recipe
    ev = eval_section(r)
    dataset = load_dataset_for(r.data, load_plugins().datasets, eval_split(r), r.train.seed)
    count = len(dataset) if ev.num_prompts == 0 else min(ev.num_prompts, len(dataset))
    rank, world = _rank_world(s.accelerator)
    indices = list(range(count))[rank::world]
    prompts = RenderedPrompts(dataset, r.data, s.tokenizer)
    rows = [prompts[i] for i in indices]
    try:
        ref = weakref.ref(s)
    except TypeError:  # objects without weak references (SimpleNamespace) are held strongly
        ref = lambda s=s: s  # noqa: E731
    _PROMPTS[id(s)] = (ref, rows, indices)
    return rows, indices


def _rank_world(accelerator: Any) -> tuple[int, int]:
    if accelerator is None:
        return 0, 1
    return accelerator.process_index, accelerator.num_processes


def _is_main(accelerator: Any) -> bool:
    return accelerator is None or accelerator.is_main_process


def _gather(accelerator: Any, samples: list[dict]) -> list[dict]:
    if _rank_world(accelerator)[1] == 1:
        return samples
    from accelerate.utils import gather_object

    return sorted(gather_object(samples), key=lambda s: (s["prompt_index"], s["sample"]))
