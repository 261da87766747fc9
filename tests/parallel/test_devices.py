"""Where tensors go: what a CPU can check of the GPU placement (the rest: tests marked gpu).

Resume reads the optimizer state onto the CPU (`map_location`): without it every process
materialises the state on the device it was saved from (GPU 0 for every process of a
multi-GPU run: out of memory for models over about 1B) before load_state_dict moves it.
"""

from __future__ import annotations

import torch
from tiny_runs import FAST

from grpocli.recipe import load_recipe


def test_resume_reads_the_optimizer_state_onto_the_cpu(tmp_path, monkeypatch):
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, "train.steps=1", f"train.output_dir={out}"]))
    seen: dict[str, object] = {}
    load = torch.load

    def spy(f, *args, **kwargs):
        seen[str(f).rsplit("/", 1)[-1]] = kwargs.get("map_location", "<none>")
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    train(load_recipe("quickstart", [*FAST, "train.steps=2", f"train.output_dir={out}"]))
    assert seen.get("optimizer.pt") == "cpu" and seen.get("rng-rank0.pt") == "cpu", seen


def test_an_in_process_reference_is_placed_on_the_process_device(tmp_path):
    from grpocli.trainer.session import Session

    s = Session.open(load_recipe("quickstart", [*FAST, "algorithm.beta=0.1", f"train.output_dir={tmp_path}"]))
    try:
        devices = {p.device for p in s.reference.parameters()} | {p.device for p in s.policy.parameters()}
        assert devices == {s.parallel.device}
    finally:
        s.close()
