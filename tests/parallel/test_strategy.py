"""The parallel strategy object on one process: what the step, generation and checkpoints ask it.
(Several processes: tests/trainer/test_fsdp*.py, test_deepspeed.py, tests/launch.)"""

from __future__ import annotations

import torch

from grpocli.parallel import Parallel, start
from grpocli.parallel.strategy import idle_forward
from grpocli.recipe import load_recipe


def test_one_process_without_accelerate_answers_for_itself():
    p = Parallel.alone()
    assert (p.size, p.rank, p.main, p.sharding, p.precision) == (1, 0, True, "none", "no")
    assert torch.equal(p.gather(torch.tensor([1.0, 2.0])), torch.tensor([1.0, 2.0]))
    assert p.total(3) == 3.0 and p.sums([1, 2]) == [1.0, 2.0] and p.fewest(4) == 4
    assert p.gather_rows([{"a": 1}]) == [{"a": 1}] and p.any_process(False) is False
    assert p.forward_passes([1, 2]) == [1, 2]          # forwards are not collectives here
    assert p.backward_passes([]) == [None]             # a process without work still joins the reduction
    p.wait()


def test_idle_loss_is_a_forward_pass_with_zero_gradient():
    """A process without a micro-batch runs one forward through the prepared model (DDP reduces
    only after one), whose backward leaves every gradient 0."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    model = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
                             build_char_tokenizer(), 0)
    seen = []
    model.register_forward_hook(lambda *_: seen.append(True))
    Parallel.alone().idle_loss(model).backward()
    assert seen and all(torch.equal(q.grad, torch.zeros_like(q)) for q in model.parameters())


def test_backward_scales_the_loss_by_the_processes_whose_gradients_are_averaged():
    """`Parallel.backward`: one process gives the loss's own gradient (with accelerate or without);
    under two processes the gradient is doubled, which DDP's mean over them undoes."""
    from accelerate import Accelerator

    class TwoProcesses(Parallel):
        size = 2  # what DDP over two processes reports; this process's accelerate then back-propagates

    grads = []
    for p in (Parallel.alone(), Parallel(Accelerator(cpu=True)), TwoProcesses(Accelerator(cpu=True))):
        w = torch.tensor([1.0, -2.0], requires_grad=True)
        p.backward((w * torch.tensor([3.0, 0.5])).sum())
        grads.append(w.grad)
    assert torch.equal(grads[0], torch.tensor([3.0, 0.5])) and torch.equal(grads[1], grads[0])
    assert torch.equal(grads[2], 2 * grads[0])


def test_start_picks_ddp_or_one_process_and_prepares_the_models(tmp_path):
    from grpocli.models import load_policy

    r = load_recipe("quickstart", [f"train.output_dir={tmp_path}"]).recipe
    p = start(r, tmp_path)
    assert type(p) is Parallel and p.size == 1 and not p.forward_collective and not p.backward_collective
    model = load_policy(r.model, 0)
    model, reference, opt, scheduler = p.prepare(model, None, lambda m: (torch.optim.SGD(m.parameters(), lr=0.1), "s"))
    assert reference is None and scheduler == "s" and p.unwrap(model) is not None
    loss = idle_forward(p.unwrap(model))  # the 1-token pass sharded strategies use for an idle process
    assert loss.item() == 0.0
    assert p.clip_grad_norm(model, 1.0) == 0.0  # no gradient yet
