"""generation.pipeline = "inflight", the trainer's side (grpocli.trainer.pipeline) against a scripted engine:
which groups a batch takes, the pacing that bounds staleness without dropping, what a checkpoint keeps.

The engine here is a simulation with a clock: each group needs a given number of ticks (tokens), one
token per tick for every group in flight, labelled with the version the engine holds at that tick; a
training cycle lasts a few ticks (the engine generates meanwhile), and a trainer that waits lets it tick
until a group ends. The real engine is tests/vllm/test_vllm_inflight.py's.
"""

from __future__ import annotations

import random

import pytest

from grpocli.generation.base import Sampling
from grpocli.generation.inflight import FinishedGroup, group_seed
from grpocli.trainer.pipeline import InflightPipeline, staleness

G = 2


class ScriptedEngine:
    """InflightBackend whose groups take `length(serial)` ticks each."""

    def __init__(self, length, train_ticks: int = 3) -> None:
        self.length, self.train_ticks = length, train_ticks
        self.version = 0
        self.live: dict[int, list[int]] = {}      # serial -> the versions of its tokens so far
        self.done: list[FinishedGroup] = []
        self.submitted: list[tuple[int, int, int]] = []  # (serial, seed, version when submitted)
        self.idle = 0.0
        self.closed = False

    def submit(self, groups, sampling):
        for g in groups:
            assert g.serial not in self.live and g.n == G
            self.live[g.serial] = []
            self.submitted.append((g.serial, g.seed, self.version))

    def tick(self) -> None:
        if not self.live:
            self.idle += 1.0
        for serial, tokens in list(self.live.items()):
            tokens.append(self.version)
            if len(tokens) >= self.length(serial):
                del self.live[serial]
                self.done.append(FinishedGroup(serial, [serial], [[7] * len(tokens)] * G, [False] * G,
                                               [[-1.0] * len(tokens)] * G, [list(tokens)] * G))

    def finished(self, timeout):
        while not self.done and timeout is None and self.live:
            self.tick()
        out, self.done = self.done, []
        return out

    def sync_weights(self, model, version):
        for _ in range(self.train_ticks):  # the engine generated while the cycle trained
            self.tick()
        self.version = version

    def idle_seconds(self):
        return self.idle

    def close(self):
        self.closed = True


def pipeline(engine, *, batch=2, cycle=1, max_staleness=1, seed=5):
    counter = iter(range(10**6))

    def take_rows(n):
        return [(pos, {"prompt_text": f"p{pos}"}) for pos in (next(counter) for _ in range(n))]

    return InflightPipeline(engine, take_rows=take_rows, encode=lambda texts: [[1, 2]] * len(texts),
                            sampling=Sampling(max_tokens=8), group_size=G, groups_per_batch=batch, cycle_steps=cycle,
                            max_staleness=max_staleness, seed=seed)


def train(p, engine, cycles, cycle=1):
    """Run the loop's cadence: take a batch at version T, train C steps, sync T + C."""
    batches, version = [], 0
    for _ in range(cycles):
        batches.append((version, p.next_batch(version)))
        version += cycle
        p.sync(None, version)
    return batches


def test_a_batch_is_the_first_groups_that_ended_and_the_rest_carry_over():
    """Lengths 9, 2, 5, 1 (max_staleness 1, B 2: four groups in the engine at once): the first batch takes
    groups 3 and 1, which ended first, in that order; 0 and 2 keep generating through the sync."""
    engine = ScriptedEngine({0: 9, 1: 2, 2: 5, 3: 1}.__getitem__, train_ticks=2)
    p = pipeline(engine)
    first = p.next_batch(0)
    assert first.serials == (3, 1) and [r["prompt_text"] for r in first.rows] == ["p3", "p1"]
    assert p.unfinished() == [0, 2]
    assert [s for s, _, _ in engine.submitted] == [0, 1, 2, 3]  # (L + 1) x B = 4 submitted at version 0
    assert first.generated.completion_ids == [[7]] * 2 + [[7] * 2] * 2  # [B*G] prompt-major, G together
    assert first.info["generation/groups_in_flight"] == 2.0


def test_a_due_group_is_waited_for_and_taken_before_faster_ones():
    """Group 0 needs 30 ticks. With max_staleness 1 it must train at version 1 at the latest (a group
    submitted at v trains by v + 1): the batch at 1 waits for it, though later groups ended before it."""
    engine = ScriptedEngine(lambda s: 30 if s == 0 else 1, train_ticks=2)
    p = pipeline(engine)
    batches = train(p, engine, 3)
    (v0, b0), (v1, b1), _ = batches
    assert 0 not in b0.serials and 0 in b1.serials and v1 == 1
    assert b1.info["generation/staleness"] == 1.0
    zero = b1.serials.index(0) * G  # its completions' rows
    assert b1.generated.versions[zero][0] == 0 and b1.generated.versions[zero][-1] == 1  # sampled by 0, then 1


@pytest.mark.parametrize(("cycle", "max_staleness"), [(1, 1), (1, 3), (2, 2), (2, 5), (3, 4)])
def test_pacing_bounds_staleness_and_trains_every_group_once(cycle, max_staleness):
    """Random lengths (1 to 40 ticks, some groups far longer than a cycle): over 60 cycles no token is
    trained more than max_staleness versions after the version that sampled it, every group that
    entered the engine is trained exactly once or is still in flight (never dropped, never restarted),
    and the engine never holds more than (max_staleness // cycle + 1) x B groups."""
    rng = random.Random(f"{cycle}:{max_staleness}")
    lengths: dict[int, int] = {}
    engine = ScriptedEngine(lambda s: lengths.setdefault(s, rng.choice([1, 2, 3, 5, 8, 13, 40])), train_ticks=4)
    batch = 3
    p = pipeline(engine, batch=batch, cycle=cycle, max_staleness=max_staleness)
    original_submit = engine.submit
    peak = []

    def submit(groups, sampling):
        original_submit(groups, sampling)
        peak.append(len(p.groups))
    engine.submit = submit
    batches = train(p, engine, 60, cycle=cycle)
    trained = [s for _, b in batches for s in b.serials]
    assert len(trained) == len(set(trained)) == 60 * batch
    assert sorted(trained + p.unfinished()) == [s for s, _, _ in engine.submitted]  # none lost
    assert max(peak) <= (max_staleness // cycle + 1) * batch
    for version, b in batches:
        ages = [version - v for completion in b.generated.versions for v in completion]
        assert max(ages) <= max_staleness, (version, b.serials)
        assert b.info["generation/staleness/max"] == max(ages) <= max_staleness
        assert b.info["generation/staleness"] <= max_staleness
    # the bound was reached (the pipeline used the staleness it was given) and groups were reordered
    assert max(b.info["generation/staleness/max"] for _, b in batches) == max_staleness - max_staleness % cycle
    assert trained != sorted(trained)


def test_each_group_is_seeded_from_its_stream_position():
    engine = ScriptedEngine(lambda s: 1)
    p = pipeline(engine, seed=5)
    p.next_batch(0)
    assert [seed for _, seed, _ in engine.submitted] == [group_seed(5, s, G) for s in range(4)]
    assert group_seed(5, 3, G) == 5 + 3 * G  # completions of group 3 take seeds 11 and 12: no overlap with 2's


def test_idle_time_and_close():
    engine = ScriptedEngine(lambda s: 1, train_ticks=3)
    p = pipeline(engine)
    p.next_batch(0)
    # its first tick ended all 4 groups; 2 trained, 2 wait ended: the engine has nothing to do while
    # the cycle trains (3 ticks), since no group is submitted before the next cycle starts
    p.sync(None, 1)
    assert p.next_batch(1).info["generation/engine_idle"] == 3.0
    p.close()
    assert engine.closed


def test_staleness_by_hand():
    """Trainer at version 5: a completion of two tokens from 3 and two from 4, another of one token from 5."""
    got = staleness(5, [[3, 3, 4, 4], [5]], submitted=[3, 5])
    assert got == {"generation/staleness": 2.0, "generation/staleness/mean": (2 + 2 + 1 + 1 + 0) / 5,
                   "generation/staleness/max": 2.0}
