"""generation.pipeline = "inflight": a completion whose tokens two policy versions sampled gets, per
token, the importance weight against the version that sampled it, as computed here by hand.

The engine's log-prob of each token is the behaviour policy's (the version that sampled it), so the
loop's existing correction (grpocli.trainer.mismatch.importance_weights) is exact per token once the
in-flight engine's log-probs reach the rollouts; this follows one group from the engine's version
spans to the weights.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from grpocli.generation.inflight import FinishedGroup, as_generated, token_versions
from grpocli.recipe.vllm_section import VllmSection
from grpocli.trainer.batching import MicroBatch
from grpocli.trainer.mismatch import importance_weights
from grpocli.trainer.pipeline import staleness
from grpocli.trainer.rollouts import Rollouts

# completion 0: tokens 0-1 sampled by version 3, tokens 2-3 by version 4 (a sync came between);
# completion 1: both tokens by version 4. The trainer trains them at version 5.
SPANS = [[SimpleNamespace(version="3", start=0, end=2), SimpleNamespace(version="4", start=2, end=4)],
         [SimpleNamespace(version="4", start=0, end=2)]]
ENGINE = [[-1.0, -2.0, -0.5, -1.5], [-0.25, -3.0]]        # the engine's log-prob of each sampled token
OLD = torch.tensor([[-1.2, -1.7, -0.9, -1.5],               # the trainer's (version 5) log-probs, [n, T]
                    [-0.25, -2.5, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


def _rollouts() -> Rollouts:
    versions = [token_versions(s, len(e), default=-1) for s, e in zip(SPANS, ENGINE)]
    group = FinishedGroup(serial=0, prompt_ids=[1, 2], completion_ids=[[5, 6, 7, 8], [9, 10]], truncated=[True, True],
                          logprobs=ENGINE, versions=versions)
    g = as_generated([group])
    return Rollouts(rows=[{"prompt_text": "p"}], prompt_ids=g.prompt_ids, completion_ids=g.completion_ids,
                    completions=["", ""], truncated=torch.tensor(g.truncated), group_size=2, engine_logprobs=g.logprobs)


def _micro_batch() -> MicroBatch:
    n, t = MASK.shape
    zeros = torch.zeros(n, t, dtype=torch.long)
    return MicroBatch(input_ids=zeros, position_ids=zeros, attention_mask=None, logit_index=torch.zeros(0),
                      labels=zeros, token_index=zeros, loss_mask=MASK, advantages=torch.zeros(n),
                      index=torch.tensor([0, 1]))


def test_token_versions_from_the_engine_spans():
    g = as_generated([FinishedGroup(0, [1], [[5, 6, 7, 8], [9, 10]], [True, True], ENGINE,
                                    [token_versions(s, len(e), default=-1) for s, e in zip(SPANS, ENGINE)])])
    assert g.versions == [[3, 3, 4, 4], [4, 4]]
    assert token_versions(None, 3, default=7) == [7, 7, 7]  # an engine never told a version


def test_per_token_weights_by_hand_for_a_completion_of_two_versions():
    """token_truncate (clip max 2): exp(old - engine) per token, each against the version that sampled it:
    completion 0: exp(-1.2 + 1.0), exp(-1.7 + 2.0) [version 3]; exp(-0.9 + 0.5), exp(-1.5 + 1.5) [version 4];
    completion 1: exp(0), exp(-2.5 + 3.0) [version 4], then padding (0)."""
    (weights,), sums = importance_weights(_rollouts(), (_micro_batch(),), (OLD,), VllmSection())
    want = torch.tensor([[0.818730753, 1.349858808, 0.670320046, 1.0],
                         [1.0, 1.648721271, 0.0, 0.0]])
    assert torch.allclose(weights, want, atol=1e-6), weights
    assert sums["tokens"] == 6.0 and sums["ratio_max"] == pytest.approx(math.exp(0.5))
    assert sums["gap_sum"] == pytest.approx(0.2 + 0.3 + 0.4 + 0.0 + 0.0 + 0.5)
    # the bounds apply per token: clip_max 1.2 cuts the version-3 token's 1.35 and the other's 1.65
    capped = VllmSection(importance_sampling_clip_max=1.2)
    (cut,), _ = importance_weights(_rollouts(), (_micro_batch(),), (OLD,), capped)
    assert torch.allclose(cut, torch.tensor([[0.818730753, 1.2, 0.670320046, 1.0], [1.0, 1.2, 0.0, 0.0]]), atol=1e-6)


def test_sequence_weights_by_hand_sum_the_log_ratios_of_both_versions():
    """sequence_truncate: one weight per sequence, exp of the summed log-ratio over both versions' tokens:
    exp(-0.2 + 0.3 - 0.4 + 0) = exp(-0.3); exp(0 + 0.5)."""
    (weights,), _ = importance_weights(_rollouts(), (_micro_batch(),), (OLD,),
                                       VllmSection(importance_sampling_mode="sequence_truncate"))
    assert torch.allclose(weights, torch.tensor([[0.740818221], [1.648721271]]), atol=1e-6), weights


def test_the_same_tokens_are_one_and_two_versions_old():
    """At version 5: [2, 2, 1, 1] and [1, 1]; the group was submitted at version 3."""
    assert staleness(5, [[3, 3, 4, 4], [4, 4]], submitted=[3]) == {
        "generation/staleness": 2.0, "generation/staleness/mean": 8 / 6, "generation/staleness/max": 2.0}
