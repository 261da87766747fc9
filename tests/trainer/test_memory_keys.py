"""The memory keys in a real run: two steps with the reference and old-policy passes chunked
(train.logprob_micro_batch_size) and the activations offloaded under gradient checkpointing give the
numbers of the same run without them."""

from __future__ import annotations

import json

import pytest
from tiny_runs import FAST

from grpocli.recipe import load_recipe


def metrics(out, *keys):
    from grpocli.trainer.loop import train

    train(load_recipe("quickstart", [*FAST, "algorithm.beta=0.1", "train.steps_per_generation=2",
                                     "train.torch_threads=1", f"train.output_dir={out}", *keys]))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_with_the_memory_keys_trains_the_same_numbers(tmp_path):
    plain = metrics(tmp_path / "plain")
    saving = metrics(tmp_path / "saving", "train.logprob_micro_batch_size=3", "train.activation_offloading=true",
                     "model.gradient_checkpointing=true")
    assert [m["step"] for m in saving] == [1, 2]
    for a, b in zip(plain, saving, strict=True):
        for key in ("loss", "kl", "grad_norm", "entropy", "reward"):
            assert b[key] == pytest.approx(a[key], abs=1e-6, rel=1e-5), key
    assert saving[1]["kl"] > 0  # the policy moved, so the reference pass mattered
