"""Parity with TRL 1.16's GRPOTrainer: advantages, loss and gradient on fixed inputs.

The cases come from TRL's own code (../shared/trl-oracle, copied to tests/trainer/data); set
GRPO_TRL_ORACLE=PATH to check another file of the same format. Each case goes through the code
a training step runs: advantages over the groups (trainer.rollouts.compute_advantages), row
selection, micro-batching in every layout, the normalisers and the optimizer step
(trainer.batching.optimizer_batches, trainer.step.optimizer_step). Only the policy's forward pass
is replaced: the log-probs are the oracle's, a leaf tensor whose gradient is compared, and the
frozen passes' log-probs (old policy, reference) are the oracle's too.
The recipe keys below are what "as TRL does" means (docs/algorithm.md, "TRL's conventions").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from grpocli.algorithms.packing import Layout
from grpocli.parallel import Parallel
from grpocli.recipe import load_recipe
from grpocli.trainer.batching import optimizer_batches
from grpocli.trainer.rollouts import Rollouts, Scored, compute_advantages
from grpocli.trainer.step import Frozen, LossSettings, optimizer_step

DEFAULT_ORACLE = Path(__file__).parent / "data" / "trl_oracle_example.json"
ORACLE = Path(os.environ.get("GRPO_TRL_ORACLE") or DEFAULT_ORACLE)
DATA = json.loads(ORACLE.read_text())
INPUTS = DATA["inputs"]
TOL = 1e-6

#: The recipe keys that make grpo compute what TRL 1.16 computes (docs/algorithm.md, "TRL's conventions").
AS_TRL = [
    "algorithm.drop_zero_spread_groups=false",        # zero-spread groups stay in every count
    "algorithm.kl_importance_correction=true",        # use_bias_correction_kl
    "algorithm.token_normalizer='generation_batch'",  # dapo / cispo / vespo normaliser
    "algorithm.truncated_rows='count'",               # masked truncated rows stay in the counts
]

#: (layout, micro_batch_size or None for a token budget): the split must not change the result.
LAYOUTS = [("padded", 100), ("shared", 5), ("packed", None), ("padded", 1)]


def recipe_for(case: dict, extra: tuple[str, ...] = ()):
    p, g, t = INPUTS["num_prompts"], INPUTS["G"], INPUTS["T"]
    eps_high = case["epsilon_high"] if case["epsilon_high"] is not None else case["epsilon"]
    return load_recipe("quickstart", [
        *AS_TRL, f"algorithm.loss='{case['loss_type']}'", f"algorithm.beta={case['beta']}",
        f"algorithm.advantage_scale='{case['scale_rewards']}'",
        f"algorithm.importance_sampling_level='{case['importance_sampling_level']}'",
        f"algorithm.epsilon_low={case['epsilon']}", f"algorithm.epsilon_high={eps_high}",
        f"algorithm.num_iterations={case['num_iterations']}", f"generation.num_generations={g}",
        f"generation.max_completion_length={t}", f"train.prompts_per_step={p}", *extra,
    ]).recipe


def scored_inputs() -> Scored:
    p, g = INPUTS["num_prompts"], INPUTS["G"]
    lengths = [int(sum(row)) for row in INPUTS["mask"]]
    rollouts = Rollouts(
        rows=[{"prompt": f"prompt {i}"} for i in range(p)], prompt_ids=[[1, 2, 3 + i] for i in range(p)],
        completion_ids=[[5] * n for n in lengths], completions=[""] * len(lengths),
        truncated=torch.zeros(len(lengths), dtype=torch.bool), group_size=g,
    )
    return Scored(rollouts, torch.tensor(INPUTS["rewards"], dtype=torch.float32), per_reward={})


def run_case(case: dict, kind: str, micro_batch_size: int | None,
             extra: tuple[str, ...] = ()) -> tuple[torch.Tensor, float, torch.Tensor]:
    """(advantages [B], loss, d loss / d new log-probs [B, T]) as grpo's training step computes them."""
    advantages, stats, grad = step_case(case, kind, micro_batch_size, extra)
    return advantages, stats["loss"], grad


def step_case(case: dict, kind: str, micro_batch_size: int | None,
              extra: tuple[str, ...] = ()) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """(advantages [B], the optimizer step's figures, d loss / d new log-probs [B, T])."""
    recipe = recipe_for(case, extra)
    if micro_batch_size is None:
        recipe.train.max_tokens_per_micro_batch = 24
    else:
        recipe.train.micro_batch_size = micro_batch_size
    parallel = Parallel(Accelerator(cpu=True))
    scored = scored_inputs()
    advantages = compute_advantages(parallel, scored, recipe.algorithm, reward_fns=[],
                                    max_completion_length=recipe.generation.max_completion_length)
    settings = LossSettings.of(recipe.algorithm, recipe.generation)
    on_policy = case["regime"] == "on_policy"
    new = torch.tensor(INPUTS["old" if on_policy else "new_off_policy"], dtype=torch.float64, requires_grad=True)
    old, ref = (torch.tensor(INPUTS[k], dtype=torch.float64) for k in ("old", "ref"))
    entropies = torch.tensor(INPUTS["entropies"], dtype=torch.float64)
    ((_, _, batch),) = optimizer_batches(parallel, scored, advantages, algorithm=recipe.algorithm, train=recipe.train,
                                         zero_advantage_rows_matter=settings.zero_advantage_rows_matter,
                                         layout=Layout(kind))
    mbs = batch.micro_batches  # what the frozen passes give: the generating policy's and the reference's log-probs
    frozen = Frozen(old_logp=None if on_policy else tuple(old[mb.index, : mb.loss_mask.shape[1]] for mb in mbs),
                    ref_logp=tuple(ref[mb.index, : mb.loss_mask.shape[1]] for mb in mbs) if settings.beta > 0 else None)

    def forward(model, mb, temperature, **_):
        width = mb.loss_mask.shape[1]
        return new[mb.index, :width] * mb.loss_mask, entropies[mb.index, :width] * mb.loss_mask

    model = torch.nn.Linear(1, 1)  # the optimizer step needs parameters; the loss is in `new`
    stats = optimizer_step(parallel, model, torch.optim.SGD(model.parameters(), lr=0.0), batch, frozen, settings,
                           max_grad_norm=0.0, forward=forward)
    grad = new.grad if new.grad is not None else torch.zeros_like(new)
    return advantages.values.double(), stats, grad


def case_id(case: dict) -> str:
    return (f"{case['loss_type']}-{case['importance_sampling_level']}-beta{case['beta']}-{case['scale_rewards']}-"
            f"{case['regime']}-eps{case['epsilon']}-{case['epsilon_high']}")


@pytest.mark.parametrize("case", DATA["cases"], ids=[case_id(c) for c in DATA["cases"]])
def test_matches_trl(case):
    layouts = LAYOUTS[:1] if case["loss_type"] == "bnpo" else LAYOUTS  # bnpo depends on the split (TRL too)
    for kind, size in layouts:
        advantages, loss, grad = run_case(case, kind, size)
        where = f"layout {kind}, micro-batch {size or 'token budget'}"
        torch.testing.assert_close(advantages, torch.tensor(case["advantages"], dtype=torch.float64),
                                   rtol=0, atol=TOL, msg=lambda m: f"advantages, {where}: {m}")
        assert loss == pytest.approx(case["loss"], rel=0, abs=TOL), where
        torch.testing.assert_close(grad, torch.tensor(case["grad_new_logps"], dtype=torch.float64),
                                   rtol=0, atol=TOL, msg=lambda m: f"gradient, {where}: {m}")


def test_the_oracle_covers_every_trl_loss():
    """The default file has every loss TRL 1.16 has; each is a grpo loss."""
    from grpocli.algorithms import LOSSES

    losses = {c["loss_type"] for c in json.loads(DEFAULT_ORACLE.read_text())["cases"]}
    assert losses == {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"} <= set(LOSSES) | losses
    assert losses <= set(LOSSES)


ON_POLICY_DAPO = {"loss_type": "dapo", "beta": 0.0, "scale_rewards": "group", "regime": "on_policy",
                  "importance_sampling_level": "token", "num_iterations": 1, "epsilon": 0.2, "epsilon_high": None}


def test_entropy_bonus_and_high_entropy_tokens_by_hand():
    """On-policy dapo with beta = 0: each token's loss is -A (ratio 1). The entropy bonus subtracts
    coef x the mean entropy of the loss tokens; top_entropy_quantile keeps the policy term of the
    top tokens by entropy only (the normaliser still counts every token, as TRL's)."""
    mask = torch.tensor(INPUTS["mask"], dtype=torch.float64)
    entropy = torch.tensor(INPUTS["entropies"], dtype=torch.float64)
    adv, loss, grad = run_case(ON_POLICY_DAPO, "padded", 100)
    per_token = -adv[:, None] * mask                                              # [B, T]
    assert loss == pytest.approx(float(per_token.sum() / mask.sum()), abs=TOL)
    _, with_bonus, grad_bonus = run_case(ON_POLICY_DAPO, "shared", 5, ("algorithm.entropy_coef=0.1",))
    bonus = 0.1 * float((entropy * mask).sum() / mask.sum())
    assert with_bonus == pytest.approx(loss - bonus, abs=TOL)
    torch.testing.assert_close(grad_bonus, grad)  # the oracle's entropies do not depend on `new`
    _, filtered, grad_filtered = run_case(ON_POLICY_DAPO, "padded", 100, ("algorithm.top_entropy_quantile=0.25",))
    threshold = torch.quantile(entropy[mask > 0], 0.75)
    kept = ((entropy * mask >= threshold) & (mask > 0)).double()
    assert 0 < kept.sum() < mask.sum()
    assert filtered == pytest.approx(float((per_token * kept).sum() / mask.sum()), abs=TOL)
    torch.testing.assert_close(grad_filtered, grad * kept)


# -- a sequence-level ratio with a token-summing loss: TRL 1.16 warns and runs it, and so does grpo --------
def trl_loss(case: dict, advantages: torch.Tensor, metrics: dict | None = None) -> tuple[float, torch.Tensor]:
    """(loss, d loss / d new log-probs) from TRL 1.16's own GRPOTrainer._compute_loss on the oracle's
    inputs: one process, no accumulation, the policy's forward pass replaced by the oracle's log-probs."""
    from collections import defaultdict
    from types import SimpleNamespace

    from trl import GRPOTrainer

    mask = torch.tensor(INPUTS["mask"], dtype=torch.float64)
    on_policy = case["regime"] == "on_policy"
    new = torch.tensor(INPUTS["old" if on_policy else "new_off_policy"], dtype=torch.float64, requires_grad=True)
    entropies = torch.tensor(INPUTS["entropies"], dtype=torch.float64)
    def same(x, **_):  # gather / reduce over one process
        return x

    eps_high = case["epsilon_high"] if case["epsilon_high"] is not None else case["epsilon"]
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (new, entropies, None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, beta=case["beta"], loss_type=case["loss_type"],
        importance_sampling_level=case["importance_sampling_level"], epsilon_low=case["epsilon"],
        epsilon_high=eps_high, use_vllm=False, vllm_importance_sampling_correction=False,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1),
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=SimpleNamespace(num_processes=1, gather=same, reduce=same, gather_for_metrics=same),
        max_completion_length=INPUTS["T"], _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    b = mask.shape[0]
    inputs = {"prompt_ids": torch.ones(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.ones_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "num_items_in_batch": mask.sum(),
              "ref_per_token_logps": torch.tensor(INPUTS["ref"], dtype=torch.float64)}
    if not on_policy:
        inputs["old_per_token_logps"] = torch.tensor(INPUTS["old"], dtype=torch.float64)
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    if metrics is not None:
        metrics.update({k: v[-1] for k, v in trainer._metrics["train"].items()})
    return float(loss.detach()), new.grad


TOKEN_SUM_SEQUENCE = [
    {"loss_type": loss, "beta": beta, "scale_rewards": "group", "regime": regime, "importance_sampling_level":
     "sequence", "num_iterations": 1 if regime == "on_policy" else 2, "epsilon": 0.2, "epsilon_high": 0.28}
    for loss in ("dapo", "bnpo", "dr_grpo", "cispo") for beta, regime in ((0.0, "off_policy"), (0.04, "on_policy"))
]


@pytest.mark.parametrize("case", TOKEN_SUM_SEQUENCE, ids=[case_id(c) for c in TOKEN_SUM_SEQUENCE])
def test_sequence_ratio_with_a_token_sum_matches_trl(case):
    """TRL's _compute_loss on the same inputs (the advantages grpo computes, which the oracle checks)."""
    advantages, _, _ = run_case(case, "padded", 100)
    trl: dict[str, float] = {}
    want_loss, want_grad = trl_loss(case, advantages, trl)
    assert want_grad.abs().sum() > 0  # the case moves the policy
    for kind, size in LAYOUTS[:1] if case["loss_type"] == "bnpo" else LAYOUTS:
        _, stats, grad = step_case(case, kind, size)
        loss = stats["loss"]
        if "clip_ratio/low_min" in trl:  # TRL's clipped losses: the per-sequence extremes, as TRL logs them
            assert stats["clip_low_min"] == pytest.approx(trl["clip_ratio/low_min"], abs=TOL), (kind, size)
            assert stats["clip_high_max"] == pytest.approx(trl["clip_ratio/high_max"], abs=TOL), (kind, size)
        assert loss == pytest.approx(want_loss, rel=0, abs=TOL), (kind, size)
        where = f"{kind}, {size}"
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=TOL, msg=lambda m, where=where: f"{where}: {m}")


def test_trl_oracle_call_reproduces_the_stored_cases():
    """trl_loss computes what the stored oracle holds for the cases TRL's file has (so the new cases are
    TRL's numbers, not a second copy of grpo's)."""
    clipped = 0
    for case in [c for c in DATA["cases"] if c["loss_type"] in ("dapo", "luspo", "grpo")][::5]:
        trl: dict[str, float] = {}
        want_loss, want_grad = trl_loss(case, torch.tensor(case["advantages"], dtype=torch.float64), trl)
        assert want_loss == pytest.approx(case["loss"], rel=0, abs=TOL), case_id(case)
        torch.testing.assert_close(want_grad, torch.tensor(case["grad_new_logps"], dtype=torch.float64),
                                   rtol=0, atol=TOL)
        _, stats, _ = step_case(case, "packed", None)  # TRL's clip_ratio/low_min and high_max, from grpo's step
        assert stats["clip_low_min"] == pytest.approx(trl["clip_ratio/low_min"], abs=TOL), case_id(case)
        assert stats["clip_high_max"] == pytest.approx(trl["clip_ratio/high_max"], abs=TOL), case_id(case)
        clipped += trl["clip_ratio/high_max"] > 0
    assert clipped  # some case clips


def test_what_trl_refuses_stays_refused_and_token_sums_run_with_a_note(capsys):
    from grpocli.errors import UserError
    from grpocli.trainer.preflight import _check_combinations

    for loss in ("dapo", "bnpo", "dr_grpo", "cispo"):  # TRL: a warning, and the run goes on
        _check_combinations(recipe_for({**ON_POLICY_DAPO, "loss_type": loss, "importance_sampling_level": "sequence"}))
        note = capsys.readouterr().err
        assert f"loss = '{loss}'" in note and "weighs by its length" in note and 'loss = "grpo"' in note
    vespo = load_recipe("quickstart", ["algorithm.loss='vespo'", "generation.backend='vllm'",
                                       "vllm.importance_sampling_mode='sequence_mask'"]).recipe
    with pytest.raises(UserError, match="token"):  # TRL raises ValueError for this one
        _check_combinations(vespo)
