"""One rule for "every N steps": is_due, and the reference refresh counted in optimizer steps."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_runs import TINY_MODEL

from grpocli.recipe import load_recipe
from grpocli.trainer.loop import Loop, train
from grpocli.trainer.session import is_due

FAST = [
    *TINY_MODEL, "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "train.micro_batch_size=8",
    "log.progress=none", "log.rollouts_every=0", "data.args={num_samples=64}",
    "algorithm.drop_zero_spread_groups=false",
]


def test_is_due():
    assert [s for s in range(1, 10) if is_due(3, s)] == [3, 6, 9]
    assert is_due(2, 3, since=1) and not is_due(2, 5, since=4) and is_due(2, 6, since=4)
    assert is_due(4, 6, since=2) and not is_due(4, 7, since=4)  # a multiple inside (since, step]
    assert not any(is_due(every, 4) or is_due(every, 4, since=0) for every in (0, None))


@pytest.mark.parametrize("per_generation", [1, 2])
def test_reference_refresh_every_ref_sync_steps_optimizer_steps(tmp_path, monkeypatch, per_generation):
    """ref_sync_steps = 3 refreshes at steps 3 and 6, with one or two optimizer steps per generation
    (the refresh used to be checked only at the end of a generation cycle: step 6 alone)."""
    refreshed: list[int] = []
    original = Loop.maybe_refresh_reference

    def spy(self):
        before = [p.detach().clone() for p in self.s.reference.parameters()]
        original(self)
        after = list(self.s.reference.parameters())
        if any(not torch.equal(a, b) for a, b in zip(after, before)):
            refreshed.append(self.s.state.step)
            policy = self.s.policy
            assert all(torch.equal(a, p) for a, p in zip(after, policy.parameters()))  # alpha = 1: a copy

    monkeypatch.setattr(Loop, "maybe_refresh_reference", spy)
    train(load_recipe("quickstart", [
        *FAST, "train.steps=6", f"train.steps_per_generation={per_generation}", "algorithm.beta=0.05",
        "algorithm.ref_sync_steps=3", "algorithm.ref_sync_alpha=1.0", f"train.output_dir={tmp_path / 'run'}",
    ]))
    assert refreshed == [3, 6]


def test_lora_reference_refresh_mixes_the_merged_policy(tmp_path, monkeypatch):
    """With LoRA the reference is a plain model: a refresh (alpha 1) makes it the policy with its
    adapters merged (peft's names and unmerged base weights would not fit it)."""
    checked: list[int] = []
    original = Loop.maybe_refresh_reference

    def spy(self):
        original(self)
        if self.s.state.step % 2 == 0:
            policy = self.s.policy
            expected = copy.deepcopy(policy).merge_and_unload().state_dict()  # peft's own merge
            for name, tensor in self.s.reference.state_dict().items():
                assert torch.allclose(tensor, expected[name], atol=1e-6), name
            lora_b = [t for name, t in policy.state_dict().items() if "lora_B" in name]
            assert any(t.abs().max() > 0 for t in lora_b)  # the adapters moved: merging changes weights
            checked.append(self.s.state.step)

    monkeypatch.setattr(Loop, "maybe_refresh_reference", spy)
    train(load_recipe("quickstart", [
        *FAST, "train.steps=2", "algorithm.beta=0.05", "model.lora.enabled=true", "train.learning_rate=0.01",
        "algorithm.ref_sync_steps=2", "algorithm.ref_sync_alpha=1.0", f"train.output_dir={tmp_path / 'run'}",
    ]))
    assert checked == [2]
