"""generation.backend = "paged": transformers' continuous batching on a real tiny model."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import FAST

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiturn"))  # turn_fixtures, as test_fsdp_lockstep
from turn_fixtures import chatty_model
from turn_fixtures import recipe as tool_recipe

from grpocli.generation.base import Sampling
from grpocli.generation.hf import HFBackend
from grpocli.generation.paged import PagedBackend
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.recipe.schema import TinyModel

PROMPTS = ["<|im_start|>user\n1+2=<|im_end|>\n", "<|im_start|>user\n300+45=<|im_end|>\n", "7"]


@pytest.fixture(scope="module")
def chatty():
    """A real tiny model whose sequences end after a few tokens (tests/multiturn/turn_fixtures.py)."""
    return chatty_model(tool_recipe())


def test_each_completion_stops_at_its_own_eos_and_repeats_for_a_seed(chatty):
    model, tok = chatty
    model.train()
    attention = model.config._attn_implementation
    backend = PagedBackend(model, tok, max_prompt_length=64)
    eos = set(model.generation_config.eos_token_id)
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(backend.generate(PROMPTS, 4, Sampling(max_tokens=40, temperature=1.0)))
    got = runs[0]
    assert got.completion_ids == runs[1].completion_ids  # same seed, same tokens
    assert len(got.completion_ids) == 12 == len(got.truncated) and got.logprobs is None
    lengths = [len(ids) for ids in got.completion_ids]
    for ids, trunc in zip(got.completion_ids, got.truncated):
        assert not any(t in eos for t in ids[:-1])             # nothing after the first EOS
        assert trunc == (ids[-1] not in eos) and (not trunc or len(ids) == 40)
    assert sum(not t for t in got.truncated) >= 8 and len(set(lengths)) >= 3, lengths  # each at its own EOS
    assert model.training and model.config._attn_implementation == attention  # the model is as it was


def sharp_tiny_model():
    """The tiny model with sharper logits: greedy runs that change token mid-way and differ by prompt."""
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModel(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4) if p.dim() > 1 else None
    return model, tok


def test_greedy_paged_equals_greedy_hf_token_for_token():
    model, tok = sharp_tiny_model()
    greedy = Sampling(max_tokens=12, top_k=1)
    paged = PagedBackend(model, tok, max_prompt_length=64).generate(PROMPTS, 2, greedy)
    hf = HFBackend(model, tok, max_prompt_length=64).generate(PROMPTS, 2, greedy)
    assert paged.prompt_ids == hf.prompt_ids
    assert paged.completion_ids == hf.completion_ids and paged.truncated == hf.truncated
    assert len({tuple(c) for c in paged.completion_ids}) == 3 and len(set(paged.completion_ids[0])) > 2
    assert PagedBackend(model, tok, max_prompt_length=64).generate(
        PROMPTS, 2, Sampling(max_tokens=12, temperature=0.0)).completion_ids == hf.completion_ids  # do_sample off


def test_a_lora_policy_samples_through_its_adapters():
    from peft import LoraConfig, get_peft_model

    model, tok = sharp_tiny_model()
    greedy = Sampling(max_tokens=12, top_k=1)
    base = PagedBackend(model, tok, max_prompt_length=64).generate(PROMPTS, 1, greedy).completion_ids
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))  # adapters that change the model (peft starts B at zero)
    paged = PagedBackend(lora, tok, max_prompt_length=64).generate(PROMPTS, 1, greedy).completion_ids
    assert paged == HFBackend(lora, tok, max_prompt_length=64).generate(PROMPTS, 1, greedy).completion_ids
    assert paged != base


def test_stop_strings_cut_the_completion_after_the_string(chatty):
    model, tok = chatty
    torch.manual_seed(0)
    free = PagedBackend(model, tok, max_prompt_length=64).generate(PROMPTS, 4, Sampling(max_tokens=40))
    text = tok.decode(max(free.completion_ids, key=len))
    stop = text[2:4]
    torch.manual_seed(0)
    cut = PagedBackend(model, tok, max_prompt_length=64).generate(PROMPTS, 4, Sampling(max_tokens=40, stop=(stop,)))
    for before, after, trunc in zip(free.completion_ids, cut.completion_ids, cut.truncated):
        assert before[: len(after)] == after                    # a prefix of the same sample
        if stop in tok.decode(before):
            assert stop in tok.decode(after) and stop not in tok.decode(after[:-1]) and not trunc


def test_multi_turn_rollouts_generate_their_turns_with_paged(chatty):
    from turn_fixtures import ROWS, SAMPLING, echo_loop, runs

    model, tok = chatty
    r = tool_recipe()
    torch.manual_seed(0)
    backend = PagedBackend(model, tok, max_prompt_length=r.data.max_prompt_length)
    conv = echo_loop(r, tok).sample(backend, ROWS, r.generation.num_generations, SAMPLING)
    assert max(sum(m["role"] == "assistant" for m in msgs) for msgs in conv.messages) >= 2
    for ids, mask in zip(conv.generated.completion_ids, conv.completion_mask):
        assert len(mask) == len(ids) <= SAMPLING.max_tokens
        assert all(ids[start - 1] == tok.eos_token_id for value, start, _ in runs(mask) if value == 0)  # after a turn


@pytest.mark.slow
def test_two_steps_with_paged_train_and_change_the_weights(grpo, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    result = grpo("train", "quickstart", *FAST, "generation.backend=paged", "generation.max_completion_length=16",
                  "train.learning_rate=1e-2", f"train.output_dir={out}")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
        assert r["time/generation"] > 0 and r["completions/mean_length"] > 0
    assert 'backend = "paged"' in (out / "config.resolved.toml").read_text()
    tok = build_char_tokenizer()
    initial = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, 0)
    trained = load_file(out / "checkpoints/step-2/model.safetensors")
    moved = max((trained[k] - v).abs().max().item() for k, v in initial.state_dict().items() if k in trained)
    assert moved > 1e-4


def test_a_repetition_penalty_with_paged_is_refused_naming_the_key(grpo, tmp_path):
    result = grpo("train", "quickstart", *FAST, "generation.backend=paged", "generation.repetition_penalty=1.1",
                  f"train.output_dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "generation.repetition_penalty" in result.stderr and "'paged'" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_sharded_policy_is_refused_before_and_at_load(chatty, grpo):
    """The one refusal, said by preflight for train.sharding = "fsdp2" (before any model loads) and by
    the backend where forwards are collectives that preflight cannot see (DeepSpeed ZeRO-3)."""
    from grpocli.errors import UserError
    from grpocli.parallel import Parallel

    out = grpo("train", "quickstart", "generation.backend=paged", "train.sharding=fsdp2", "train.num_processes=2",
               "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "generation.backend" in out.stderr and "FSDP2 policy is a collective" in out.stderr, out.stderr

    class Collective(Parallel):
        forward_collective = True

    model, tok = chatty
    with pytest.raises(UserError, match="FSDP2 or DeepSpeed ZeRO-3 policy is a collective") as caught:
        PagedBackend(model, tok, max_prompt_length=64, parallel=Collective(None))
    assert caught.value.where == "generation.backend" and "'hf'" in caught.value.valid
