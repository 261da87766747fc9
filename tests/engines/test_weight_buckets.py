"""grpocli.generation.weights: names, specs, buckets and wire formats (no vLLM needed)."""

from __future__ import annotations

import threading

import pytest
import torch

from grpocli.generation.weights import (
    TensorSpec,
    broadcast,
    buckets,
    checkpoint_spec,
    flatten_bucket,
    open_group,
    pack_bucket,
    policy_weights,
    spec_problems,
    unflatten_bucket,
    unpack_bucket,
)


def _tiny(tiny_shape, seed=0):
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    return build_tiny_model(TinyModel(**tiny_shape), build_char_tokenizer(), seed)


def test_buckets_keep_order_and_size():
    a, b, c, big = torch.zeros(4), torch.zeros(8), torch.zeros(2), torch.zeros(20)  # 16, 32, 8, 80 bytes
    got = [[n for n, _ in bucket] for bucket in buckets([("a", a), ("b", b), ("c", c), ("big", big), ("a2", a)], 40)]
    assert got == [["a"], ["b", "c"], ["big"], ["a2"]]  # 16+32 > 40; 32+8 = 40 fits; 80 goes alone


def test_safetensors_bucket_round_trip():
    bucket = [("w", torch.arange(6, dtype=torch.float32).view(2, 3)),
              ("h", torch.tensor([1.5, -2.0], dtype=torch.bfloat16)), ("i", torch.tensor([7], dtype=torch.int64))]
    back = dict(unpack_bucket(pack_bucket(bucket)))
    for name, tensor in bucket:
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    with pytest.raises(ValueError, match="not a safetensors file"):
        unpack_bucket(b"not safetensors")


def test_flat_bucket_round_trip_and_size_check():
    bucket = [("x", torch.tensor([[1.0, 2.0]])), ("y", torch.tensor([3, 4, 5], dtype=torch.int16)),
              ("z", torch.tensor([0.25], dtype=torch.bfloat16))]
    flat, specs = flatten_bucket(bucket)
    assert flat.dtype == torch.uint8 and flat.numel() == 16 + 6 + 10 + 2  # each starts 16-byte aligned
    assert specs[1] == TensorSpec("y", (3,), "int16") and specs[1].nbytes == 6
    for (name, want), (got_name, got) in zip(bucket, unflatten_bucket(flat, specs)):
        assert name == got_name and got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(ValueError, match="holds 34 bytes, its spec describes 32"):
        unflatten_bucket(flat, specs[:2] + [TensorSpec("z", (0,), "bfloat16")])


def test_policy_weights_list_tied_tensors_once(tiny_shape):
    model = _tiny(tiny_shape)
    with policy_weights(model, torch.bfloat16) as weights:
        assert weights.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
        names = [s.name for s in weights.specs()]
        assert "lm_head.weight" not in names and names == [n for n, _ in weights.unique()]
        assert [n for n, _ in weights][-1] == "lm_head.weight"
        assert {s.dtype for s in weights.specs()} == {"bfloat16"}
        assert all(t.dtype == torch.bfloat16 for _, t in weights)


def test_checkpoint_spec_matches_the_policy_and_reports_differences(tiny_shape, tmp_path):
    from grpocli.models import build_char_tokenizer, save_model

    model = _tiny(tiny_shape)
    save_model(model, build_char_tokenizer(), tmp_path)
    expected = checkpoint_spec(tmp_path, torch.float32)
    with policy_weights(model, torch.float32) as weights:
        assert spec_problems(expected, weights.specs()) == []
        specs = weights.specs()
    wrong = [TensorSpec("model.norm.weight", (63,), "float32"), TensorSpec("model.nrm.bias", (64,), "float32"),
             TensorSpec("model.layers.0.mlp.up_proj.weight", (128, 64), "bfloat16")]
    problems = spec_problems(expected, wrong)
    assert problems[0] == "model.norm.weight: shape [63], the engine's is [64]"
    assert problems[1].startswith("model.nrm.bias: not in the engine's model (did you mean")
    assert problems[2] == "model.layers.0.mlp.up_proj.weight: dtype bfloat16, the engine's is float32"
    assert problems[3].startswith(f"{len(specs) - 2} of the engine's tensors missing:")


def test_lora_is_merged_under_base_names_and_the_model_is_left_as_it_was(tiny_shape):
    peft = pytest.importorskip("peft")
    base = _tiny(tiny_shape)
    base_names = [s.name for s in _specs(base)]
    model = peft.get_peft_model(_tiny(tiny_shape), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    ids = torch.tensor([[5, 6, 7]])
    before = model(ids).logits
    q = "model.layers.0.self_attn.q_proj.weight"
    with policy_weights(model) as weights:
        assert [s.name for s in weights.specs()] == base_names
        sent = dict(weights)[q].clone()
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling["default"]
    assert torch.allclose(sent, layer.base_layer.weight + delta, atol=1e-6)
    assert torch.allclose(model(ids).logits, before, atol=1e-6)  # the adapters still apply, not merged in


def _specs(model):
    with policy_weights(model) as weights:
        return weights.specs()


def test_gloo_group_broadcasts_a_bucket():
    """Two ranks (threads here, processes in use) over a TCPStore: the receiver gets the bucket."""
    from datetime import timedelta

    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=20), wait_for_workers=False)
    bucket = [("a", torch.arange(5, dtype=torch.float32)), ("b", torch.tensor([[1, 2]], dtype=torch.int64))]
    flat, specs = flatten_bucket(bucket)
    received = {}

    def server():
        group = open_group("gloo", master, 1, 2, 20, hostname="127.0.0.1")
        buf = torch.empty(flat.numel(), dtype=torch.uint8)
        broadcast(group, buf, 20, root=0)
        received.update(unflatten_bucket(buf, specs))

    thread = threading.Thread(target=server)
    thread.start()
    client_store = dist.TCPStore("127.0.0.1", master.port, 2, False, timedelta(seconds=20))
    broadcast(open_group("gloo", client_store, 0, 2, 20, hostname="127.0.0.1"), flat, 20, root=0)
    thread.join(20)
    assert torch.equal(received["a"], bucket[0][1]) and torch.equal(received["b"], bucket[1][1])
