"""Loading tokenizer, policy and reference from a [model] section: tiny, dirs, errors, LoRA."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from grpocli.errors import UserError
from grpocli.models import load_policy, load_reference, load_tokenizer, save_model
from grpocli.recipe.schema import ModelSection

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def _section(**kwargs) -> ModelSection:
    return ModelSection(tiny=TINY, **kwargs)


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits  # [1, T, V]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    """A tiny policy + tokenizer written the way checkpoints are."""
    directory = tmp_path_factory.mktemp("saved")
    section = _section()
    save_model(load_policy(section, seed=3), load_tokenizer(section), directory)
    return directory


def test_tiny_reference_equals_initial_policy_and_is_frozen():
    section = _section()
    policy, reference = load_policy(section, seed=5), load_reference(section, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), reference.parameters()))
    assert not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in policy.parameters())


def test_tiny_tokenizer_is_the_char_tokenizer():
    tok = load_tokenizer(_section())
    assert len(tok) == 104 and tok.pad_token_id == 0 and tok.eos_token_id == 2


def test_dtype_and_gradient_checkpointing_are_applied():
    policy = load_policy(_section(dtype="bfloat16", gradient_checkpointing=True), seed=0)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert policy.is_gradient_checkpointing
    policy.train()
    policy(torch.tensor([[9, 10, 11]]), labels=torch.tensor([[9, 10, 11]])).loss.backward()
    assert policy.model.embed_tokens.weight.grad is not None


def test_a_saved_policy_loads_in_training_mode_so_checkpointing_recomputes(saved_dir):
    """from_pretrained returns eval mode, where transformers skips gradient checkpointing."""
    policy = load_policy(ModelSection(name_or_path=str(saved_dir), gradient_checkpointing=True), seed=0)
    assert policy.training
    calls = []
    policy.model.layers[0].mlp.register_forward_pre_hook(lambda *args: calls.append(1))
    policy(torch.tensor([[9, 10, 11]]), labels=torch.tensor([[9, 10, 11]])).loss.backward()
    assert len(calls) == 2  # the forward, and its recomputation in backward


def test_local_directory_loads_the_saved_weights(saved_dir):
    section = ModelSection(name_or_path=str(saved_dir))
    policy = load_policy(section, seed=99)  # the seed does not matter for saved weights
    original = load_policy(_section(), seed=3)
    ids = load_tokenizer(section).encode("<think>1+1</think><answer>2</answer>")
    assert torch.equal(_logits(policy, ids), _logits(original.eval(), ids))


def test_tokenizer_without_pad_gets_eos_as_pad(tmp_path):
    tok = load_tokenizer(_section())
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(ModelSection(name_or_path="tiny", tokenizer=str(tmp_path)))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "a/b/c"])
def test_missing_path_is_a_fast_user_error(path):
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        load_policy(ModelSection(name_or_path=path), seed=0)
    assert time.monotonic() - start < 3
    assert err.value.where == "model.name_or_path"
    assert "no model at" in err.value.what and "hf download" in err.value.hint


def test_unfetchable_hub_id_offline_is_a_fast_user_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        load_reference(ModelSection(name_or_path="grpocli-tests/no-such-model"), seed=0)
    assert time.monotonic() - start < 3
    assert "hub id grpocli-tests/no-such-model could not be fetched (offline?)" in err.value.what
    with pytest.raises(UserError, match="could not be fetched"):
        load_tokenizer(ModelSection(name_or_path="tiny", tokenizer="grpocli-tests/no-such-tok"))


def test_directory_without_config_is_a_user_error(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match="has no config.json"):
        load_policy(ModelSection(name_or_path=str(tmp_path)), seed=0)


def test_lora_trains_only_adapters_and_starts_at_the_reference():
    section = _section(lora={"enabled": True, "r": 4, "alpha": 8})
    policy = load_policy(section, seed=0)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    frozen = [n for n, p in policy.named_parameters() if not p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("embed_tokens" in n for n in frozen)
    # 7 linear layers (q, k, v, o, gate, up, down) x (A, B) in the single layer; not lm_head.
    assert len(trainable) == 14
    ids = [1, 20, 30, 2]
    assert torch.equal(_logits(policy.eval(), ids), _logits(load_reference(section, seed=0), ids))
    again = load_policy(section, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), again.parameters()))


def test_lora_with_unknown_target_modules_names_the_valid_ones():
    section = _section(lora={"enabled": True, "target_modules": ["qkv_proj"]})
    with pytest.raises(UserError) as err:
        load_policy(section, seed=0)
    assert err.value.where == "model.lora.target_modules"
    assert "q_proj" in err.value.valid


def test_lora_without_peft_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` raise ImportError
    with pytest.raises(UserError) as err:
        load_policy(_section(lora={"enabled": True}), seed=0)
    assert "grpocli[peft]" in err.value.hint


def test_directory_without_tokenizer_files_is_a_user_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError) as err:
        load_tokenizer(ModelSection(name_or_path=str(tmp_path)))
    assert err.value.where == "model.name_or_path"
    assert "tokenizer_config.json or tokenizer.json" in err.value.what
    assert "model.tokenizer" in err.value.hint


def test_importing_the_package_imports_neither_torch_nor_transformers():
    import subprocess

    code = "import sys, grpocli.models; "
    code += "print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_unusable_attn_implementation_is_a_user_error():
    with pytest.raises(UserError) as err:
        load_policy(_section(attn_implementation="no-such-attention"), seed=0)
    assert err.value.where == "model.attn_implementation"
    assert "'sdpa'" in err.value.valid
