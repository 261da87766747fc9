"""train.logprob_micro_batch_size: the no-grad log-prob passes (the old policy's, the reference's) in
chunks of at most that many sequences give the log-probs of the training micro-batches, and the
peak memory of a pass falls with the chunk (measured by torch's profiler on this CPU)."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from grpocli.algorithms.packing import Layout
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.recipe.schema import TinyModel
from grpocli.trainer.batching import logprob_chunks, make_micro_batches
from grpocli.trainer.rollouts import Rollouts
from grpocli.trainer.step import frozen_logprobs


def tiny(attn: str = "sdpa"):
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, 0,
                             attn_implementation=attn).eval()
    return tok, model, Parallel(Accelerator(cpu=True))


def rollouts(vocab: int, groups: int = 3, g: int = 4, seed: int = 0) -> Rollouts:
    """`groups` prompts x `g` completions of different lengths (random tokens)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab, (5 + 3 * k,), generator=gen).tolist() for k in range(groups)]
    comps = [torch.randint(10, vocab, (2 + (7 * i) % 11,), generator=gen).tolist() for i in range(groups * g)]
    n = len(comps)
    return Rollouts(rows=[{}] * groups, prompt_ids=prompts, completion_ids=comps, completions=[""] * n,
                    truncated=torch.zeros(n, dtype=torch.bool), group_size=g)


def passes(model, p, r, mbs, size, *, packed=False, layout=None):
    chunks = logprob_chunks(r, mbs, max_sequences=size, packed=packed, layout=layout or Layout())
    return chunks, frozen_logprobs(p, model, mbs, 1.0, chunks)


@pytest.mark.parametrize("kind", ["padded", "shared"])
def test_chunked_passes_give_the_micro_batches_log_probs(kind):
    tok, model, p = tiny()
    r = rollouts(len(tok))
    layout = Layout(kind)
    mbs = tuple(make_micro_batches(r, torch.zeros(12), list(range(12)), max_sequences=6, layout=layout))
    _, want = passes(model, p, r, mbs, None, layout=layout)
    assert [w.shape for w in want] == [mb.loss_mask.shape for mb in mbs]
    for size, count in ((1, 12), (3, 4), (5, 3), (12, 1)):  # smaller than, across and over the micro-batches
        chunks, got = passes(model, p, r, mbs, size, layout=layout)
        assert len(chunks) == count and max(c.num_sequences for c in chunks) == min(size, 12)
        for a, b, mb in zip(got, want, mbs, strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            assert bool((a[mb.loss_mask == 0] == 0).all())


def test_with_a_token_budget_each_micro_batch_is_cut_on_its_own():
    """max_tokens_per_micro_batch: a chunk never joins two micro-batches, so it keeps their budget."""
    tok, model, p = tiny()
    r = rollouts(len(tok))
    mbs = tuple(make_micro_batches(r, torch.zeros(12), list(range(12)), max_sequences=12, max_tokens=60))
    assert len(mbs) > 2
    _, want = passes(model, p, r, mbs, None)
    chunks, got = passes(model, p, r, mbs, 2, packed=True)
    for mb in mbs:
        inside = [c for c in chunks if set(c.index.tolist()) <= set(mb.index.tolist())]
        assert sum(c.num_sequences for c in inside) == mb.num_sequences  # cut inside it, nothing across
    assert all(c.num_sequences <= 2 and c.sequence_tokens <= 60 for c in chunks)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def peak_bytes(fn) -> int:
    """The most CPU memory torch's allocator held above the start while `fn` ran: the profiler's
    allocation and free events (kineto's "[memory]" records, + or - bytes), summed in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    deltas = sorted((e.start_ns(), e.nbytes()) for e in records)
    held = peak = 0
    for _, delta in deltas:
        held += delta
        peak = max(peak, held)
    return peak


def test_a_smaller_chunk_has_a_smaller_peak():
    tok, model, p = tiny()
    r = rollouts(len(tok), groups=4, g=8)
    mbs = tuple(make_micro_batches(r, torch.zeros(32), list(range(32)), max_sequences=16))
    peaks = {size: peak_bytes(lambda size=size: passes(model, p, r, mbs, size)) for size in (None, 4, 1)}
    print("peak bytes of the no-grad passes by logprob_micro_batch_size:", peaks)  # docs/benchmarks.md's figures (pytest -s)
    assert peaks[None] > peaks[4] > peaks[1] > 0, peaks
    assert peaks[1] < peaks[None] / 4, peaks
