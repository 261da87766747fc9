"""The variant tables (grpocli.algorithms.variants): one entry each, the recipe's names and
preflight's rules derived from them, every entry's numbers checked by hand.

A new entry without hand numbers here fails `test_every_entry_has_hand_numbers`; a schema or
preflight that does not follow the entries fails the tests below it.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from grpocli.algorithms.losses import LossNorm, PolicyTerms, SurrogateSettings
from grpocli.algorithms.variants import (
    ADVANTAGES,
    IMPORTANCE_SAMPLING_MODES,
    KL_ESTIMATORS,
    LOSSES,
    loss_aliases,
)
from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.recipe.algorithm_section import AlgorithmSection
from grpocli.recipe.vllm_section import VllmSection

LN2 = math.log(2.0)
EPS = 1e-4  # STD_EPS

# -- hand numbers ---------------------------------------------------------------------------
# Losses, on policy (ratio 1), one micro-batch of two sequences, default settings (epsilon 0.2,
# SAPO tau 1 / 1.05, VESPO k, lambda 2, 3 / 3, 2):
#   sequence 0: A = +1, log-probs ln 0.5, ln 0.25        sequence 1: A = -3, log-prob ln 0.25 (1 token)
#   normalisers: 2 sequences, 3 tokens, max_completion_length 4, 1 micro-batch
# Per-token objectives:
#   clip:  -A                         -> [-1, -1], [3]
#   cispo: -min(r, 0.2) A logp        -> [0.2 ln2, 0.4 ln2], [-1.2 ln2]   (sum -0.6 ln2)
#   sapo:  -sigmoid(0) 4 / tau A      -> [-2, -2], [6 / 1.05 = 40/7]
#   vespo: -phi(w = 1) A logp, phi 1  -> [ln2, 2 ln2], [-6 ln2]           (sum -3 ln2)
#   gmpo:  -exp(mean of log r = 0) A  -> [-1], [3] per sequence (broadcast over its tokens)
# Aggregations: grpo = mean of sequence means; bnpo = token mean / micro-batches; dr_grpo =
# sum / (4 x 2); dapo = sum / 3 tokens; luspo = sum / 2 sequences.
HAND_LOSSES = {
    "grpo": (-1 + 3) / 2,                # 1.0
    "bnpo": (-1 - 1 + 3) / 3,            # 1/3
    "dr_grpo": (-1 - 1 + 3) / 8,         # 0.125
    "dapo": (-1 - 1 + 3) / 3,            # 1/3
    "luspo": (-1 - 1 + 3) / 2,           # 0.5
    "cispo": -0.6 * LN2 / 3,             # dapo's aggregation: -0.2 ln2
    "sapo": (-2 + 40 / 7) / 2,           # grpo's aggregation: 13/7
    "vespo": -3 * LN2 / 3,               # dapo's aggregation: -ln2
    "gmpo": (-1 + 3) / 2,                # grpo's aggregation of one term per sequence: 1.0
}

# KL at one token, policy p = 0.5, reference q = 0.25: log_r = ln q - ln p = -ln2
HAND_KL = {
    "k1": LN2, "kl": LN2,                            # logp - ref
    "k2": 0.5 * LN2**2, "mse": 0.5 * LN2**2,         # (logp - ref)^2 / 2
    "k3": 0.5 + LN2 - 1, "low_var_kl": 0.5 + LN2 - 1,  # e^log_r - log_r - 1 (inside verl's clamps)
    "abs": LN2,
    "full": None,                                    # refused: no numbers
}

# Advantages of rewards [[0, 1, 2], [3, 3, 3]] (the second group flat):
#   group: [-1, 0, 1] / (std 1 + eps); batch: [-1, 0, 1] / (std of all 6 = sqrt(8/5) + eps);
#   none, centered: [-1, 0, 1]; rloo: G/(G-1) (r - mean) = [-1.5, 0, 1.5];
#   reinforce_pp: c = [-1, 0, 1, 0, 0, 0] whitened, std sqrt(2/5);
#   normalize_then_sum (the total as its one component): [-1, 0, 1] / (1 + eps), then whitened
_C = 1 / (1 + EPS)
HAND_ADVANTAGES = {
    "group": [-_C, 0.0, _C],
    "batch": [-1 / (math.sqrt(1.6) + EPS), 0.0, 1 / (math.sqrt(1.6) + EPS)],
    "none": [-1.0, 0.0, 1.0],
    "centered": [-1.0, 0.0, 1.0],
    "rloo": [-1.5, 0.0, 1.5],
    "reinforce_pp": [-1 / (math.sqrt(0.4) + EPS), 0.0, 1 / (math.sqrt(0.4) + EPS)],
    "normalize_then_sum": [-_C / (_C * math.sqrt(0.4) + EPS), 0.0, _C / (_C * math.sqrt(0.4) + EPS)],
}

# Engine importance weights: trainer old log-probs [0, -1], engine's [0, -2], bounds (None, 2):
# token ratios [1, e]; the sequence's ratio e^(0 + 1) = e, its geometric mean e^(1/2) = 1.65.
# OpenRLHF's divergence gates, divergence_max 0.1: engine p = [1, e^-2], trainer q = [1, e^-1] (1 -> 1 - 1e-6);
# token 1: binary KL = p ln(p/q) + (1-p) ln((1-p)/(1-q)) = 0.1355, TV = |p - q| = 0.2325 (token 0: 0 both);
# sequence means 0.0678 (binary KL, kept) and 0.1163 (TV, dropped). Kept tokens keep their own ratio.
DIVERGENCE_MAX = 0.1
HAND_MODES = {
    "token_truncate": [[1.0, 2.0]],   # e clamped to 2
    "token_mask": [[1.0, 0.0]],       # e outside the bounds: 0
    "sequence_truncate": [[2.0]],
    "sequence_mask": [[0.0]],
    "sequence_geomean_mask": [[1.0, math.e]],  # 1.65 <= 2: kept
    "token_binary_kl_mask": [[1.0, 0.0]],      # 0.1355 > 0.1
    "token_tv_mask": [[1.0, 0.0]],             # 0.2325 > 0.1
    "sequence_binary_kl_mask": [[1.0, math.e]],  # 0.0678 <= 0.1
    "sequence_tv_mask": [[0.0, 0.0]],            # 0.1163 > 0.1
}


def test_every_entry_has_hand_numbers():
    assert set(HAND_LOSSES) == set(LOSSES)
    assert set(HAND_KL) == set(KL_ESTIMATORS)
    assert set(HAND_ADVANTAGES) == set(ADVANTAGES)
    assert set(HAND_MODES) == set(IMPORTANCE_SAMPLING_MODES)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_by_hand(name):
    entry = LOSSES[name]
    logp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.25), 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    x = PolicyTerms(logp=logp, log_ratio=torch.zeros_like(logp), ratio=torch.ones_like(logp),
                    advantages=torch.tensor([[1.0], [-3.0]], dtype=torch.float64), mask=mask)
    per_token, _, _ = entry.objective_fn(x, SurrogateSettings())
    norm = LossNorm(num_sequences=2, num_tokens=3, max_completion_length=4, num_micro_batches=1)
    assert entry.aggregation_fn(per_token, mask, norm).item() == pytest.approx(HAND_LOSSES[name], abs=1e-6)


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_kl_by_hand(name):
    entry = KL_ESTIMATORS[name]
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    if HAND_KL[name] is None:
        assert entry.refused and entry.function is None
        with pytest.raises(ValueError, match="refused"):
            entry.fn  # noqa: B018
        return
    assert entry.fn(logp, ref).item() == pytest.approx(HAND_KL[name], rel=1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_advantage_by_hand(name):
    got = ADVANTAGES[name].fn(torch.tensor([[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]]))
    torch.testing.assert_close(got, torch.tensor([HAND_ADVANTAGES[name], [0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("name", sorted(IMPORTANCE_SAMPLING_MODES))
def test_importance_mode_by_hand(name):
    mode = IMPORTANCE_SAMPLING_MODES[name]
    extra = {"divergence_max": DIVERGENCE_MAX} if mode.gates_divergence else {}
    got = mode.fn(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -2.0]]), torch.ones(1, 2), None, 2.0, **extra)
    torch.testing.assert_close(got, torch.tensor(HAND_MODES[name]))
    assert (got.shape[-1] == 1) == mode.per_sequence


def _functions():
    for table in (LOSSES, ADVANTAGES, KL_ESTIMATORS, IMPORTANCE_SAMPLING_MODES):
        for name, entry in table.items():
            refs = [entry.objective, entry.aggregation] if table is LOSSES else [entry.function]
            for ref in refs:
                if ref is not None:
                    yield f"{name}:{ref}", ref


@pytest.mark.parametrize("ref", [ref for _, ref in _functions()], ids=[i for i, _ in _functions()])
def test_every_function_names_its_paper_or_source(ref):
    from grpocli.algorithms.variants import resolve

    doc = resolve(ref).__doc__ or ""
    assert "arXiv:" in doc or "http" in doc, f"{ref}: its docstring names no paper (arXiv:...) or source URL"


# -- the recipe and preflight follow the entries -------------------------------------------
def _literal(section, field: str) -> set[str]:
    return set(get_args(section.model_fields[field].annotation))


def test_the_recipe_accepts_exactly_the_tables_names():
    assert _literal(AlgorithmSection, "loss") == set(LOSSES)
    assert _literal(AlgorithmSection, "advantage_scale") == set(ADVANTAGES)
    assert _literal(AlgorithmSection, "kl_estimator") == set(KL_ESTIMATORS)
    assert _literal(VllmSection, "importance_sampling_mode") == set(IMPORTANCE_SAMPLING_MODES)
    for alias, name in loss_aliases().items():  # verl's names land on their entry
        assert load_recipe("quickstart", [f"algorithm.loss='{alias}'"]).recipe.algorithm.loss == name
    for table, field in ((LOSSES, "loss"), (ADVANTAGES, "advantage_scale"), (KL_ESTIMATORS, "kl_estimator")):
        description = AlgorithmSection.model_fields[field].description
        assert all(name in description for name in table), field  # the help text lists every entry


def _refused(*overrides: str) -> UserError | None:
    from grpocli.trainer.preflight import _check_combinations

    try:
        _check_combinations(load_recipe("quickstart", list(overrides)).recipe)
    except UserError as err:
        return err
    return None


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_preflight_rules_follow_the_loss_entry(name):
    entry = LOSSES[name]
    loss = f"algorithm.loss='{name}'"
    assert _refused(loss) is None
    for key in ("delta=1.5", "clip_ratio_c=3.0"):  # the clipped surrogate's bounds
        err = _refused(loss, f"algorithm.{key}")
        assert (err is None) == entry.clipped, (key, err)
    err = _refused(loss, "algorithm.importance_sampling_level='sequence'")  # TRL warns for token sums, runs them
    assert (err is None) == (not entry.token_level_only), err
    err = _refused(loss, "generation.backend='vllm'", "vllm.importance_sampling_mode='sequence_mask'")
    assert (err is None) == (not entry.own_engine_weights), err  # folds the engine's token weights itself
    err = _refused(loss, "algorithm.top_entropy_quantile=0.2")  # the 80/20 filter inside its sequence weight
    assert (err is None) == (not entry.filter_inside), err


def test_preflight_rules_follow_the_other_entries():
    for name, entry in KL_ESTIMATORS.items():
        err = _refused(f"algorithm.kl_estimator='{name}'", "algorithm.beta=0.1")
        assert (err is None) == (entry.refused is None), name
    gated = ['rewards=[{name="length", gate=true}, {name="length"}]', "algorithm.reward_combination='gated'"]
    for name, entry in ADVANTAGES.items():
        err = _refused(f"algorithm.advantage_scale='{name}'", *gated)
        assert (err is None) == (not entry.needs_components), name
