"""One optimizer step on a real tiny model: skipping non-finite updates, micro-batching invariance."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from grpocli.algorithms import LossNorm
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.recipe.schema import TinyModel
from grpocli.trainer.batching import (
    OptimizerBatch,
    make_micro_batches,
    select_sequences,
)
from grpocli.trainer.rollouts import Advantages, Rollouts
from grpocli.trainer.step import Frozen, LossSettings, micro_batch_loss, optimizer_step


def setup(seed=0):
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64), tok, seed)
    acc = Accelerator(cpu=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    return tok, model, Parallel(acc), opt


def rollouts(tok, advantages) -> tuple[Rollouts, Advantages]:
    g = 4
    prompts = [tok("1+2=", add_special_tokens=False)["input_ids"], tok("30+4=", add_special_tokens=False)["input_ids"]]
    texts = ["3", "4<|im_end|>", "33", "12345", "34", "3", "43", "34<|im_end|>"]
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    n = len(comps)
    return (Rollouts(rows=[{}, {}], prompt_ids=prompts, completion_ids=comps, completions=texts,
                     truncated=torch.zeros(n, dtype=torch.bool), group_size=g),
            Advantages(torch.tensor(advantages, dtype=torch.float32), torch.zeros(2, dtype=torch.bool),
                       torch.ones(n, dtype=torch.bool)))


def micro_batches(r, indices, **kwargs):
    rollouts, advantages = r
    return tuple(make_micro_batches(rollouts, advantages.values, indices, **kwargs))


SETTINGS = dict(beta=0.0, kl_estimator="k3", temperature=1.0,
                max_completion_length=8)


def test_non_finite_update_is_skipped_and_weights_stay(tmp_path):
    tok, model, acc, opt = setup()
    before = [p.detach().clone() for p in model.parameters()]
    r = rollouts(tok, [float("inf"), -1, 1, 0.5, 1, -1, 0.5, -0.5])
    mbs = micro_batches(r, list(range(8)), pad_id=0, max_sequences=4)
    stats = optimizer_step(acc, model, opt, OptimizerBatch(mbs), Frozen(), LossSettings(loss="dapo", **SETTINGS),
                           max_grad_norm=1.0)
    assert stats["skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # a finite batch does update
    r = rollouts(tok, [1.0, -1, 1, 0.5, 1, -1, 0.5, -0.5])
    stats = optimizer_step(acc, model, opt, OptimizerBatch(micro_batches(r, list(range(8)), pad_id=0, max_sequences=4)),
                           Frozen(), LossSettings(loss="dapo", **SETTINGS), max_grad_norm=1.0)
    assert stats["skipped"] == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def grads_for(name: str, **layout) -> list[torch.Tensor]:
    """Gradients of the whole batch's loss, summed over the micro-batches of one layout."""
    tok, model, acc, opt = setup()
    r = rollouts(tok, [1.0, -1, 1, 0.5, 1, -1, 0.5, -0.5])
    mbs = micro_batches(r, list(range(8)), pad_id=0, **layout)
    norm = LossNorm(num_sequences=8, num_tokens=sum(mb.num_tokens for mb in mbs), max_completion_length=8,
                    num_micro_batches=len(mbs))
    for mb in mbs:
        loss, _ = micro_batch_loss(model, mb, (None, None, None), LossSettings(loss=name, **SETTINGS), norm)
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_gradient_does_not_depend_on_micro_batch_layout(loss):
    one = grads_for(loss, max_sequences=8)
    per_seq = grads_for(loss, max_sequences=1)
    budget = grads_for(loss, max_sequences=8, max_tokens=24)
    for a, b, c in zip(one, per_seq, budget):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"])
def test_skipping_zero_advantage_rows_keeps_the_gradient(loss):
    """Rows with advantage 0 (and no KL or entropy term) need no forward pass: counted as idle
    rows, the update (plain SGD, lr 1: minus the gradient) equals the one with every row computed."""
    updates = []
    for skip in (False, True):
        tok, model, acc, _ = setup()
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        before = [p.detach().clone() for p in model.parameters()]
        r = rollouts(tok, [1.0, 0.0, -1, 0.5, 0.0, -1, 0.5, 0.0])
        chosen = select_sequences(*r, skip_zero_advantage=skip)
        assert len(chosen.computed) == (5 if skip else 8)
        batch = OptimizerBatch(micro_batches(r, chosen.computed, pad_id=0, max_sequences=3),
                               idle_sequences=len(chosen.idle), idle_tokens=chosen.idle_tokens)
        optimizer_step(acc, model, opt, batch, Frozen(), LossSettings(loss=loss, **SETTINGS), max_grad_norm=0.0)
        updates.append([p.detach() - b for p, b in zip(model.parameters(), before)])
    assert any(u.abs().max() > 0 for u in updates[0])
    for a, b in zip(*updates):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
