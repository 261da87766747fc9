"""In-flight generation (generation.pipeline = "inflight"): the engine never stops generating; each
generation cycle trains the first B complete groups, and the others keep generating, through the
weight syncs, for a later cycle.

B is the cycle's batch as in the synchronous loop (train.prompts_per_step x train.steps_per_generation
groups of G completions, this process's share), and a cycle is C = train.steps_per_generation x
algorithm.num_iterations optimizer steps. Versions count optimizer steps: the engine holds version T
while the cycle that starts at step T trains, and takes T + C at the sync that ends it (between two
of its steps, requests kept: grpocli.generation.inflight). A token's staleness is the version of the
cycle that trains it minus the version that sampled it; no token is trained more than K =
generation.max_staleness versions after it was sampled, by pacing, not by dropping:

* admission: at the start of each cycle the engine is given groups until L + 1 cycles' worth
  (L = K // C, at least 1) are submitted and not yet trained; then it takes no more until the next
  cycle starts (generation waits: `generation/engine_idle` says for how long it had nothing to do);
* a group submitted at version v is due at the cycle T where T + C - v > K (the next cycle would be
  too late): each batch takes every due group, waiting for it to finish, then the groups that ended
  first, up to B. Admission keeps the due groups at most B, so every group is trained, once, at most
  K versions after it started, with all its G completions together.

Dropping a group whose tokens got too old instead would drop the long completions more often than the
short ones, since they take longer, and bias training toward short completions (tinker-cookbook PR
#822); here no group is dropped or restarted.

A checkpoint records the stream positions of the groups submitted and not yet trained
(`unfinished`); a resumed run generates them again, first, with its own weights (their partial
completions are not kept), so no group is lost or trained twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.generation.base import Generated, Sampling
from grpocli.generation.inflight import FinishedGroup, GroupRequest, InflightBackend, as_generated, group_seed

if TYPE_CHECKING:
    from grpocli.trainer.session import Session


@dataclass
class _Group:
    serial: int                       # its row's position in the prompt stream
    row: dict[str, Any]
    submitted_at: int                 # the version the engine held when it was submitted
    done: FinishedGroup | None = None


@dataclass(frozen=True)
class InflightBatch:
    """One cycle's groups, as the pipeline took them."""

    rows: list[dict[str, Any]]        # [B]
    generated: Generated              # [B*G] with engine log-probs and token versions
    serials: tuple[int, ...]          # [B] the groups' stream positions
    waited: float                     # seconds the trainer waited for them
    info: dict[str, float]            # generation/staleness..., groups in flight, engine idle


class InflightPipeline:
    """The trainer's side of in-flight generation (the module docstring): `next_batch`, `sync`,
    `unfinished` for checkpoints, `close`."""

    def __init__(self, backend: InflightBackend, *, take_rows: Callable[[int], list[tuple[int, dict[str, Any]]]],
                 encode: Callable[[list[str]], list[list[int]]], sampling: Sampling, group_size: int,
                 groups_per_batch: int, cycle_steps: int, max_staleness: int, seed: int) -> None:
        self.backend, self.take_rows, self.encode, self.sampling = backend, take_rows, encode, sampling
        self.group_size, self.batch, self.cycle, self.max_staleness = group_size, groups_per_batch, cycle_steps, \
            max_staleness
        self.seed = seed
        self.lag = max(max_staleness // cycle_steps, 1)  # cycles a group may wait after the one it was submitted in
        self.capacity = (self.lag + 1) * groups_per_batch  # groups submitted and not yet trained, at most
        self.groups: dict[int, _Group] = {}           # submitted, not yet trained: in the order submitted
        self.ended: list[int] = []                    # the finished ones, in the order they ended
        self.idle_seen = 0.0

    @classmethod
    def start(cls, s: Session, sampling: Sampling) -> InflightPipeline:
        """The session's pipeline: its backend's engine starts stepping on its own thread now."""
        r, p = s.recipe, s.parallel
        cycle = r.train.steps_per_generation * r.algorithm.num_iterations
        groups = r.train.prompts_per_step * r.train.steps_per_generation
        return cls(s.backend.start_inflight(s.state.step, kv_cache=r.generation.inflight_kv_cache), take_rows=lambda n: s.next_numbered_rows(n * p.size),
                   encode=s.backend.encode_prompts, sampling=sampling, group_size=r.generation.num_generations,
                   groups_per_batch=groups // p.size, cycle_steps=cycle,
                   max_staleness=r.generation.max_staleness or cycle, seed=r.train.seed + p.rank)

    def next_batch(self, version: int) -> InflightBatch:
        """The B groups the cycle starting at ``version`` trains (waiting for them), the engine topped up first."""
        self._submit(version)
        self._collect(timeout=0)
        t0 = time.perf_counter()
        while True:
            forced = self._forced(version)
            if all(self.groups[s].done for s in forced) and len(self.ended) >= self.batch:
                break
            self._collect(timeout=None)
        waited = time.perf_counter() - t0
        chosen = forced + [s for s in self.ended if s not in forced][: self.batch - len(forced)]
        taken = [self.groups.pop(s) for s in chosen]
        self.ended = [s for s in self.ended if s in self.groups]
        generated = as_generated([g.done for g in taken])
        idle = self.backend.idle_seconds()
        info = {**staleness(version, generated.versions, [g.submitted_at for g in taken]),
                "generation/groups_in_flight": float(len(self.groups)), "generation/engine_idle": idle - self.idle_seen}
        self.idle_seen = idle
        return InflightBatch([g.row for g in taken], generated, tuple(chosen), waited, info)

    def _forced(self, version: int) -> list[int]:
        """The groups this cycle must take so that every group still meets its deadline (the last cycle
        that may train it: submitted at v, trained by v + lag x C): with c_j the groups due by cycle
        version + j x C, at least c_0 and c_j - j x B of them now, the earliest deadlines first (of equal
        ones, those that ended first). Admission keeps it at most B."""
        deadline = {s: g.submitted_at + self.lag * self.cycle for s, g in self.groups.items()}
        due_by = [sum(d <= version + j * self.cycle for d in deadline.values()) for j in range(self.lag + 1)]
        need = max([due_by[0]] + [c - j * self.batch for j, c in enumerate(due_by) if j])
        assert need <= self.batch, (need, self.batch)  # admission: at most (lag + 1) x B in the engine
        ended = {s: i for i, s in enumerate(self.ended)}
        order = sorted(self.groups, key=lambda s: (deadline[s], ended.get(s, len(ended) + s)))
        return order[: max(need, 0)]

    def sync(self, model: Any, version: int) -> None:
        """The policy's weights to the engine, between two of its steps; what it samples next is ``version``."""
        self.backend.sync_weights(model, version)

    def unfinished(self) -> list[int]:
        """The stream positions of the groups submitted and not yet trained, in the order submitted."""
        return list(self.groups)

    def close(self) -> None:
        self.backend.close()

    def _submit(self, version: int) -> None:
        """Give the engine groups until `capacity` are submitted and not yet trained."""
        room = self.capacity - len(self.groups)
        if room <= 0:
            return
        numbered = self.take_rows(room)
        ids = self.encode([row["prompt_text"] for _, row in numbered]) if numbered else []
        requests = []
        for (serial, row), prompt_ids in zip(numbered, ids, strict=True):
            self.groups[serial] = _Group(serial, row, version)
            requests.append(GroupRequest(serial, prompt_ids, self.group_size,
                                         group_seed(self.seed, serial, self.group_size)))
        self.backend.submit(requests, self.sampling)

    def _collect(self, timeout: float | None) -> None:
        for done in self.backend.finished(timeout):
            self.groups[done.serial].done = done
            self.ended.append(done.serial)


def staleness(version: int, versions: list[list[int]] | None, submitted: list[int]) -> dict[str, float]:
    """A batch's staleness at ``version``: over its tokens (`/mean`, `/max`: the trainer's version minus
    the token's), and over its groups (`generation/staleness`: the oldest version a group started from,
    as the synchronous loop's async_steps logs it)."""
    ages = [version - v for completion in versions or [] for v in completion]
    return {"generation/staleness": float(max((version - v for v in submitted), default=0)),
            "generation/staleness/mean": sum(ages) / len(ages) if ages else 0.0,
            "generation/staleness/max": float(max(ages, default=0))}


__all__ = ["InflightBatch", "InflightPipeline", "staleness"]
