"""Engine/trainer importance sampling (TRL's four modes) against hand-computed numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import get_args

import pytest
import torch
from pydantic import ValidationError

from grpocli.algorithms import IMPORTANCE_SAMPLING_MODES, mismatch_sums
from grpocli.errors import UserError
from grpocli.recipe import load_recipe, to_toml
from grpocli.recipe.vllm_section import ImportanceSamplingMode, VllmSection

E = math.e
NAN = float("nan")

# Row 0: gaps 0, 1, NaN (engine log-prob missing -> gap 0, ratio 1).
# Row 1: gaps 0, -2, and a gap of 8.5 on a token outside the mask (-> 0, ratio 1).
OLD = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -3.0, -0.5]])
ENGINE = torch.tensor([[0.0, -2.0, NAN], [-1.0, -1.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# token ratios [[1, e, 1], [1, e^-2, 1]]; sequence log-ratios 1 and -2 -> ratios e and e^-2


def weights(mode: str, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    return IMPORTANCE_SAMPLING_MODES[mode].fn(OLD, ENGINE, MASK, clip_min, clip_max)


TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def test_the_table_has_trl_names_and_the_schema_offers_them_all():
    assert set(IMPORTANCE_SAMPLING_MODES) == set(get_args(ImportanceSamplingMode)) >= set(TRL_MODES)


def test_token_truncate_clamps_each_token_ratio():
    torch.testing.assert_close(weights("token_truncate", 0.5, 2.0), torch.tensor([[1.0, 2.0, 1.0], [1.0, 0.5, 1.0]]))
    # no lower bound: e^-2 = 0.1353 stays
    torch.testing.assert_close(weights("token_truncate", None, 2.0),
                               torch.tensor([[1.0, 2.0, 1.0], [1.0, math.exp(-2), 1.0]]))


def test_token_mask_zeroes_each_token_outside_the_bounds():
    torch.testing.assert_close(weights("token_mask", 0.5, 2.0), torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]))
    torch.testing.assert_close(weights("token_mask", None, 2.0),
                               torch.tensor([[1.0, 0.0, 1.0], [1.0, math.exp(-2), 1.0]]))
    torch.testing.assert_close(weights("token_mask", 0.5, None), torch.tensor([[1.0, E, 1.0], [1.0, 0.0, 1.0]]))


def test_sequence_truncate_clamps_one_ratio_per_sequence():
    w = weights("sequence_truncate", 0.5, 2.0)
    assert w.shape == (2, 1)
    torch.testing.assert_close(w, torch.tensor([[2.0], [0.5]]))
    torch.testing.assert_close(weights("sequence_truncate", None, 3.0), torch.tensor([[E], [math.exp(-2)]]))


def test_sequence_mask_drops_sequences_outside_the_bounds():
    w = weights("sequence_mask", 0.5, 3.0)
    assert w.shape == (2, 1)
    torch.testing.assert_close(w, torch.tensor([[E], [0.0]]))
    torch.testing.assert_close(weights("sequence_mask", None, 2.0), torch.tensor([[0.0], [math.exp(-2)]]))
    torch.testing.assert_close(weights("sequence_mask", None, None), torch.tensor([[E], [math.exp(-2)]]))


@pytest.mark.parametrize("mode", TRL_MODES)  # OpenRLHF's gates: tests/algorithms/test_openrlhf_correction.py
def test_micro_batch_weights_are_masked_tokens_or_one_per_sequence(mode):
    from grpocli.trainer.mismatch import importance_weights

    # engine log-probs per rollout (ragged); the third sequence has no loss token
    part = SimpleNamespace(engine_logprobs=[[0.0, -2.0, -1.0], [-1.0, -1.0], [-1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mb = SimpleNamespace(index=torch.tensor([0, 1, 2]), loss_mask=mask)
    old = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -3.0, 0.0], [0.0, 0.0, 0.0]])
    vllm = VllmSection(importance_sampling_mode=mode, importance_sampling_clip_max=2.0)
    (is_weight,), sums = importance_weights(part, (mb,), (old,), vllm)
    assert sums["tokens"] == 5.0  # the metrics stay those of the raw ratio
    expected = {
        "token_truncate": [[1.0, 2.0, math.exp(-1)], [1.0, math.exp(-2), 0.0], [0.0, 0.0, 0.0]],
        "token_mask": [[1.0, 0.0, math.exp(-1)], [1.0, math.exp(-2), 0.0], [0.0, 0.0, 0.0]],
        "sequence_truncate": [[1.0], [math.exp(-2)], [0.0]],  # log-ratios 0, -2; no loss token -> 0
        "sequence_mask": [[1.0], [math.exp(-2)], [0.0]],
    }[mode]
    torch.testing.assert_close(is_weight, torch.tensor(expected))


def test_defaults_are_todays_training_and_trl_names_are_accepted():
    v = load_recipe(None).recipe.vllm
    assert (v.importance_sampling_mode, v.importance_sampling_clip_min, v.importance_sampling_clip_max) == (
        "token_truncate", None, 2.0)
    v = load_recipe(None, ["vllm.importance_sampling_mode=sequence_mask", "vllm.importance_sampling_clip_max=3.0",
                           "vllm.importance_sampling_clip_min=0.5"]).recipe.vllm
    assert (v.importance_sampling_mode, v.importance_sampling_clip_min, v.importance_sampling_clip_max) == (
        "sequence_mask", 0.5, 3.0)


def test_deprecated_cap_still_loads_as_clip_max(tmp_path):
    resolved = load_recipe(None, ["vllm.importance_sampling_cap=3.0"])
    v = resolved.recipe.vllm
    assert v.importance_sampling_clip_max == 3.0 and v.importance_sampling_mode == "token_truncate"
    recipe = tmp_path / "r.toml"
    recipe.write_text("[vllm]\nimportance_sampling_cap = 3.0\n")
    assert load_recipe(str(recipe)).recipe.vllm.importance_sampling_clip_max == 3.0
    # the resolved recipe names only the new key, and reads back the same
    text = to_toml(resolved.recipe)
    assert "importance_sampling_cap" not in text and "importance_sampling_clip_max = 3.0" in text
    again = tmp_path / "again.toml"
    again.write_text(text)
    assert load_recipe(str(again)).recipe.vllm == v


def test_no_upper_bound_is_inf_in_toml_and_round_trips(tmp_path):
    resolved = load_recipe(None, ["vllm.importance_sampling_mode=sequence_mask",
                                  "vllm.importance_sampling_clip_max=inf"])
    assert resolved.recipe.vllm.importance_sampling_clip_max == math.inf
    out = tmp_path / "r.toml"
    out.write_text(to_toml(resolved.recipe))
    assert load_recipe(str(out)).recipe.vllm.importance_sampling_clip_max == math.inf


def test_bounds_that_cannot_work_are_refused():
    with pytest.raises(UserError, match=r"importance_sampling_clip_min \(3.0\) must be less than"):
        load_recipe(None, ["vllm.importance_sampling_clip_min=3.0", "vllm.importance_sampling_clip_max=2.0"])
    with pytest.raises(UserError, match="give only importance_sampling_clip_max"):
        load_recipe(None, ["vllm.importance_sampling_cap=3.0", "vllm.importance_sampling_clip_max=2.5"])
    with pytest.raises(ValidationError, match="clamps the ratio"):
        VllmSection(importance_sampling_clip_max=None)  # token_truncate with no bound at all
    with pytest.raises(UserError, match="sequence_mask"):
        load_recipe(None, ["vllm.importance_sampling_mode=sequence"])


def test_mismatch_sums_use_only_masked_tokens():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    engine = torch.tensor([[0.0, -2.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = mismatch_sums(old, engine, mask)
    # gaps on masked tokens: 0 and 1 -> sum 1, max 1; ratios 1 and e
    assert s["tokens"] == 2.0 and s["gap_sum"] == 1.0 and s["gap_max"] == 1.0
    assert math.isclose(s["ratio_sum"], 1 + math.e, rel_tol=1e-6)
    assert s["ratio_min"] == 1.0 and math.isclose(s["ratio_max"], math.e, rel_tol=1e-6)
