"""Tiny Qwen2 models: deterministic by seed, forward/backward, and a save/load round trip."""

from __future__ import annotations

import json

import pytest
import torch

from grpocli.models import build_char_tokenizer, build_tiny_model, save_model
from grpocli.recipe.schema import TinyModel

SHAPE = TinyModel(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(SHAPE, tok, seed=0)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_same_seed_same_bits_other_seed_other_weights(tok, model):
    assert _same_weights(model, build_tiny_model(SHAPE, tok, seed=0))
    assert not _same_weights(model, build_tiny_model(SHAPE, tok, seed=1))


def test_building_leaves_the_global_rng_alone(tok):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(SHAPE, tok, seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_config_matches_section_and_tokenizer(tok, model):
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers) == (len(tok), 32, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (4, 4, 64)
    assert c.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert (c.pad_token_id, c.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]


def test_forward_and_backward(tok, model):
    batch = tok(["<|im_start|>user\n1+1<|im_end|>", "hi"], padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(tok))  # [B, T, V]
    assert torch.isfinite(out.logits).all()
    out.loss.backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_generate_emits_known_ids(tok, model):
    prompt = tok("<|im_start|>assistant\n", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=5, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= prompt["input_ids"].shape[1] + 5
    assert int(out.max()) < len(tok)


def test_save_and_load_round_trip(tmp_path, tok, model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_model(model, tok, tmp_path)
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (tmp_path / name).is_file(), name
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == tok.chat_template
    gen_config = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen_config["eos_token_id"] == [2, 0]

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    # transformers 5 reloads it as Qwen2Tokenizer (model_type qwen2): it must tokenize the same.
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for sample in ("<think>a b\n</think><answer>3</answer>", "  x\n\n\ty's  don't  ", "2×3=6"):
        assert loaded_tok.encode(sample) == tok.encode(sample)
        assert loaded_tok.decode(loaded_tok.encode(sample)) == tok.decode(tok.encode(sample))
    assert (loaded_tok.pad_token_id, loaded_tok.eos_token_id) == (0, 2)
    text = "<think>a b\n</think><answer>3</answer>"
    assert loaded_tok.chat_template == tok.chat_template
    ids = torch.tensor([tok.encode(text)])
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
