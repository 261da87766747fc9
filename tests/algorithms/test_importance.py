"""Truncated importance sampling against hand-computed numbers."""

from __future__ import annotations

import math

import torch

from grpocli.algorithms import mismatch_sums, truncated_importance_weights


def test_weights_are_the_ratio_capped():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    engine = torch.tensor([[0.0, -2.0, -1.0]])
    # exp(0) = 1; exp(-1 - -2) = e = 2.718 -> capped at 2; exp(-2 - -1) = 1/e = 0.3679
    w = truncated_importance_weights(old, engine, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, math.exp(-1)]]))


def test_mismatch_sums_use_only_masked_tokens():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    engine = torch.tensor([[0.0, -2.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = mismatch_sums(old, engine, mask)
    # gaps on masked tokens: 0 and 1 -> sum 1, max 1; ratios 1 and e
    assert s["tokens"] == 2.0 and s["gap_sum"] == 1.0 and s["gap_max"] == 1.0
    assert math.isclose(s["ratio_sum"], 1 + math.e, rel_tol=1e-6)
    assert s["ratio_min"] == 1.0 and math.isclose(s["ratio_max"], math.e, rel_tol=1e-6)
