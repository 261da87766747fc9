"""train.activation_offloading: the training forward's saved tensors go through the offloading hooks
(copied to host memory and back) and the gradients are those without them, with and without gradient
checkpointing; on a GPU the device memory held at the start of backward drops (marker `gpu`)."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from grpocli.algorithms import LossNorm
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.recipe.schema import TinyModel
from grpocli.trainer.batching import OptimizerBatch, make_micro_batches
from grpocli.trainer.offloading import ActivationOffloading
from grpocli.trainer.rollouts import Rollouts
from grpocli.trainer.step import Frozen, LossSettings, micro_batch_loss, optimizer_step

SETTINGS = LossSettings(loss="dapo", beta=0.0, kl_estimator="k3", temperature=1.0, max_completion_length=16)


def tiny(checkpointing: bool, device: str = "cpu", shape: TinyModel | None = None):
    tok = build_char_tokenizer()
    shape = shape or TinyModel(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    model = build_tiny_model(shape, tok, 0)
    if checkpointing:  # as grpocli.models.loader turns it on
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return tok, model.to(device).train()


def batch(vocab: int):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, vocab, (6,), generator=gen).tolist() for _ in range(2)]
    comps = [torch.randint(10, vocab, (4 + 3 * i,), generator=gen).tolist() for i in range(8)]
    r = Rollouts(rows=[{}, {}], prompt_ids=prompts, completion_ids=comps, completions=[""] * 8,
                 truncated=torch.zeros(8, dtype=torch.bool), group_size=4)
    adv = torch.tensor([1.0, -1, 0.5, -0.5, 1, -1, 0.25, -0.25])
    return make_micro_batches(r, adv, list(range(8)), max_sequences=4)


def grads(model, mbs, offload):
    model.zero_grad()
    norm = LossNorm(num_sequences=8, num_tokens=sum(mb.num_tokens for mb in mbs), max_completion_length=16,
                    num_micro_batches=len(mbs))
    packed = 0
    for mb in mbs:
        if offload is None:
            loss, _ = micro_batch_loss(model, mb, (None, None, None), SETTINGS, norm)
        else:
            with offload:
                loss, _ = micro_batch_loss(model, mb, (None, None, None), SETTINGS, norm)
            packed += offload.packed
        loss.backward()
    return [p.grad.clone() for p in model.parameters()], packed


@pytest.mark.parametrize("checkpointing", [False, True])
def test_offloaded_activations_give_the_same_gradients(checkpointing):
    tok, model = tiny(checkpointing)
    mbs = batch(len(tok))
    want, _ = grads(model, mbs, None)
    offload = ActivationOffloading(model)
    got, packed = grads(model, mbs, offload)
    assert packed > 0  # the hooks copied tensors (each once), not only kept them
    assert offload.kept > 0  # the weights that linear layers save stayed where they are
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    if checkpointing:  # the layers keep no activations of their own: fewer tensors leave than without
        _, plain = grads(tiny(False)[1], mbs, ActivationOffloading(tiny(False)[1]))
        assert packed < plain


class _ReadsSavedStrides(torch.autograd.Function):
    """Saves a tensor as sdpa saves its padded mask and records the strides backward sees."""

    seen: list[tuple[int, ...]] = []

    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(bias)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (bias,) = ctx.saved_tensors
        _ReadsSavedStrides.seen.append(bias.stride())
        return grad * 2, None


def test_a_saved_view_comes_back_with_its_strides():
    """PyTorch's memory-efficient attention pads the mask's rows (30 -> 32) and saves the narrowed
    view; its backward checks that row stride. An offloaded copy must keep it (on an H200 it did not:
    "attn_bias is not correctly aligned (strideM)")."""
    bias = torch.zeros(2, 1, 30, 32)[..., :30]              # [r, 1, 30, 30] with rows 32 apart
    x = torch.ones(4, requires_grad=True)
    _ReadsSavedStrides.seen.clear()
    with ActivationOffloading(torch.nn.Linear(2, 2)) as offload:
        y = _ReadsSavedStrides.apply(x, bias)
    y.sum().backward()
    assert offload.packed == 1                               # copied, not kept in place
    assert _ReadsSavedStrides.seen == [bias.stride()] == [(960, 960, 32, 1)]


def test_optimizer_step_offloads_when_asked():
    tok, model = tiny(False)
    p = Parallel(Accelerator(cpu=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = p.accelerator.prepare(model, opt)
    offload = ActivationOffloading(model)
    stats = optimizer_step(p, model, opt, OptimizerBatch(tuple(batch(len(tok)))), Frozen(), SETTINGS,
                           max_grad_norm=1.0, offload=offload)
    assert stats["skipped"] == 0.0 and offload.packed > 0 and offload.offloaded_bytes > 0


@pytest.mark.gpu
def test_device_memory_at_backward_drops_on_a_gpu():
    """The memory the graph holds when backward starts (after forward) falls with offloading."""
    tok, model = tiny(False, "cuda", TinyModel(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024))
    mbs = batch(len(tok))
    norm = LossNorm(num_sequences=8, num_tokens=sum(mb.num_tokens for mb in mbs), max_completion_length=16,
                    num_micro_batches=1)
    held = {}
    runs = (("warm-up", None), ("plain", None), ("offloaded", ActivationOffloading(model)))  # warm-up: cuBLAS workspace
    for name, offload in runs:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        if offload is None:
            loss, _ = micro_batch_loss(model, mbs[1], (None, None, None), SETTINGS, norm)
        else:
            with offload:
                loss, _ = micro_batch_loss(model, mbs[1], (None, None, None), SETTINGS, norm)
        torch.cuda.synchronize()
        held[name] = torch.cuda.memory_allocated() - base
        loss.backward()
        model.zero_grad(set_to_none=True)
    assert held["offloaded"] < held["plain"] * 0.8, held
