"""On one CUDA GPU (marker `gpu`; skipped elsewhere, with the reason): where the policy, the
reference and the optimizer state live after a step and after a resume; mixed precision with a
forced fp16 overflow; the attention layouts agreeing in bf16. Tiny models built from a config,
offline; each test well under 2 minutes on one H100."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import FAST

from grpocli.recipe import load_recipe

pytestmark = pytest.mark.gpu


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors if isinstance(t, torch.Tensor)}


def test_policy_reference_and_optimizer_state_live_on_the_gpu_and_resume_there(tmp_path):
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    out = tmp_path / "run"
    settings = [*FAST, "train.steps=1", "algorithm.beta=0.1", "train.mixed_precision=bf16", f"train.output_dir={out}"]
    for steps in (1, 2):  # a first run, then a resume from its checkpoint
        s = Session.open(load_recipe("quickstart", [*settings, f"train.steps={steps}"]))
        try:
            assert _devices(s.policy.parameters()) == {"cuda"} and _devices(s.reference.parameters()) == {"cuda"}
            Loop(s).run()
            state = [t for per in s.optimizer.state_dict()["state"].values() for t in per.values()]
            assert state and _devices(state) == {"cuda"}
        finally:
            s.close()
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kl"] == 0.0  # the reference's pass runs under the policy's autocast


def test_fp16_overflow_is_skipped_and_training_goes_on(tmp_path):
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    resolved = load_recipe("quickstart", [*FAST, "train.steps=3", "train.mixed_precision=fp16", f"train.output_dir={out}"])
    resolved.recipe.train.__dict__["learning_rate"] = 1e30  # past the key's bound (1): the first update overflows fp16
    train(resolved)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3] and any(m["skipped_update"] for m in metrics)


def test_attention_layouts_agree_in_bf16():
    from grpocli.algorithms.logprobs import sequence_logprobs
    from grpocli.algorithms.packing import Layout, build_rows
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    tok = build_char_tokenizer()
    seqs = [(0, [5, 6, 7, 8], [9, 10, 11]), (0, [5, 6, 7, 8], [12, 13]), (1, [7, 8], [12, 13, 14, 15])]
    got = {}
    for kind, attn in (("shared", "sdpa"), ("padded", "sdpa"), ("packed", "flash_attention_2")):
        if attn.startswith("flash"):
            pytest.importorskip("flash_attn", reason="flash-attn is not installed")
        model = build_tiny_model(TinyModel(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), tok, 0,
                                 attn_implementation=attn).to("cuda", torch.bfloat16)
        with torch.no_grad():
            got[kind], _ = sequence_logprobs(model, build_rows(seqs, Layout(kind)), 1.0)
    for kind in ("padded", "packed"):
        if kind in got:
            torch.testing.assert_close(got[kind], got["shared"], atol=2e-2, rtol=0)


def test_float32_master_weights_take_every_update_on_the_gpu(tmp_path, capfd):
    """The CPU's check of float32 masters against bf16 weights (test_precision.py), on CUDA."""
    import test_precision

    test_precision.test_bf16_weights_without_float32_masters_lose_small_updates_and_are_warned_about(tmp_path, capfd)
