"""LoRA weight syncs (grpocli.generation.lora, .weights): adapters added out of place, the base never written.

peft's merge_adapter / unmerge_adapter (the sync before) rounds a bf16 base weight on every round
trip: after 50 syncs of the model below 40.0% of its adapted base weights had changed (rms 8.1e-4,
float32 adapters; 34.8% and rms 5.2e-5 with bf16 adapters); now none has.

What is sent is compared with peft's own merge (`merge_and_unload` of a copy). The sum is computed
in float32 and cast once. With float32 adapters (peft's default for a bf16 base, and grpo's) peft
adds the same float32 product, so the two differ by at most one bf16 unit in the last place, where
the float32 products round differently (here: in no element). With bf16 adapters peft rounds the
product ``d = s * B @ A`` to bf16 before adding it, so the two differ by at most
``2**-8 * (|d| + 2 |merged|)`` elementwise (half a unit of d and of each rounded sum, a half unit
being at most 2**-8 of a value); here 28.5% of the adapted elements differ, by at most 4.9e-4.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

peft = pytest.importorskip("peft")

#: A tiny Qwen2 (the shape the vLLM tests use).
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}
#: One unit in the last place of bfloat16, relative (8 significant bits: at most 2**-7 of a value).
BF16_ULP = 2**-7


def _lora_model(dtype: torch.dtype, adapter_dtype: str = "float32", **lora):
    """A tiny Qwen2 in `dtype` with LoRA on every linear layer, lora_B drawn at random (peft starts
    it at 0, where adding it changes nothing); adapters in float32 (peft's default for a bf16 base)
    or in the base's dtype."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    model = build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 0).to(dtype)
    config = peft.LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "task_type": "CAUSAL_LM",
                                **lora})
    model = peft.get_peft_model(model, config, autocast_adapter_dtype=adapter_dtype == "float32")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "lora_magnitude" in name:
                param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.05)
    return model


def _expected(model) -> dict[str, torch.Tensor]:
    """peft's own merge of a copy: the base model's state dict with the adapters merged in."""
    return copy.deepcopy(model).merge_and_unload().state_dict()


@pytest.mark.parametrize("adapter_dtype", ["float32", "bfloat16"])
def test_fifty_lora_syncs_leave_the_base_weights_bit_identical(adapter_dtype):
    from grpocli.generation.weights import policy_weights

    model = _lora_model(torch.bfloat16, adapter_dtype)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    terms = _adapted(before)
    expected = _expected(model)
    for _ in range(50):  # a colocated engine walks every tensor, a server sync walks each once
        with policy_weights(model) as weights:
            sent = {name: t.clone() for name, t in weights}
            assert sum(t.numel() for _, t in weights.unique()) > 0
    after = model.state_dict()
    changed = [name for name, t in before.items() if not torch.equal(after[name], t)]
    assert changed == [], f"{len(changed)} tensors changed, e.g. {changed[:3]}"
    assert not any(getattr(m, "merged", False) for m in model.modules())
    assert sorted(sent) == sorted(expected)  # the base model's names, a tied lm_head included
    assert len(terms) == 2 * 7 and all(sent[n].dtype == torch.bfloat16 for n in sent)  # 7 linear layers a block
    with policy_weights(model, torch.float32) as weights:
        exact = dict(weights.unique())  # W + d in float32 (one rounding of a float32 sum)
    for name, tensor in sent.items():
        if name in terms:
            _within_rounding(tensor, expected[name], exact[name], before, name, adapter_dtype)
        else:  # no adapter: sent as the model holds it, as peft's merge leaves it
            assert torch.equal(tensor, expected[name]), name
    moved = max((exact[n] - _base(before, n).float()).abs().max() for n in terms)
    assert moved > 1e-3  # the adapters do change what is sent


def _adapted(state: dict[str, torch.Tensor]) -> set[str]:
    """The checkpoint names of the weights that carry an adapter (``...q_proj.weight``)."""
    return {n.removeprefix("base_model.model.").replace(".base_layer", "")
            for n in state if n.endswith(".base_layer.weight")}


def _base(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """An adapted base weight under its peft state-dict name (``...q_proj.base_layer.weight``)."""
    return state[f"base_model.model.{name.removesuffix('.weight')}.base_layer.weight"]


def _within_rounding(sent, merged, exact, before, name, adapter_dtype) -> None:
    """sent vs peft's merged weight: one bf16 unit in the last place with float32 adapters; with
    bf16 adapters 2**-8 * (|d| + 2 |merged|) elementwise, d the float32 product (module docstring)."""
    if adapter_dtype == "float32":
        torch.testing.assert_close(sent, merged, rtol=BF16_ULP, atol=1e-6, msg=name)
        return
    d = (exact - _base(before, name).float()).abs()
    gap = (sent.float() - merged.float()).abs()
    bound = 2**-8 * (d + 2 * merged.float().abs()) + 1e-7
    assert (gap <= bound).all(), f"{name}: {gap.max():.3g} beyond rounding"


def test_what_is_sent_in_float32_is_the_sum_itself():
    """Cast once: a bf16 policy sent to a float32 engine gets W + s * B @ A in float32 (peft's merge
    would hand it the bf16-rounded sum), and plain tensors only change dtype."""
    from grpocli.generation.weights import policy_weights

    model = _lora_model(torch.bfloat16)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    w, a, b = layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = w.float() + layer.scaling["default"] * (b.float() @ a.float())
    with policy_weights(model, torch.float32) as weights:
        sent = dict(weights)
        assert {s.dtype for s in weights.specs()} == {"float32"}
    torch.testing.assert_close(sent["model.layers.0.self_attn.q_proj.weight"], want, rtol=1e-6, atol=1e-7)
    assert torch.equal(sent["model.norm.weight"], model.base_model.model.model.norm.weight.float())


def test_the_reference_mix_gets_the_sums_and_the_model_stays_as_it_was():
    """`PolicyWeights.state()` (what trainer/loop.py mixes into an in-process reference): the sum
    for an adapted weight, computed when looked up; every other tensor is the model's own."""
    from grpocli.generation.weights import policy_weights
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel
    from grpocli.reference.mixing import mix_state

    model = _lora_model(torch.float32)
    expected, before = _expected(model), {n: t.clone() for n, t in model.state_dict().items()}
    reference = build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 7)  # a plain model, other weights
    with policy_weights(model) as weights:
        state = weights.state()
        assert sorted(state) == sorted(expected)
        assert state["model.norm.weight"] is dict(weights.entries)["model.norm.weight"]
        mix_state(reference, state, 1.0)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-6, msg=name)
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())


def test_fan_in_fan_out_layers_are_added_transposed():
    """GPT-2's Conv1D holds its weight as [in, out]: the sum is W + s * (B @ A).T, as peft merges it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpocli.generation.weights import policy_weights

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    with torch.no_grad():
        model.base_model.model.transformer.h[0].attn.c_attn.lora_B["default"].weight.normal_(0.0, 0.1)
    expected, before = _expected(model), {n: t.clone() for n, t in model.state_dict().items()}
    with policy_weights(model) as weights:
        assert len(weights.terms) == 1
        sent = dict(weights)
    name = "transformer.h.0.attn.c_attn.weight"
    assert sent[name].shape == (32, 96)
    torch.testing.assert_close(sent[name], expected[name], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(sent[name], before[f"base_model.model.{name[:-7]}.base_layer.weight"])
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())


def test_dora_falls_back_to_merging_in_place_with_a_warning():
    """A LoRA variant the out-of-place sum does not cover (DoRA) is merged by peft and unmerged
    after, as before: what is sent is still the merged model, and the sync says why."""
    from grpocli.generation.lora import Uncovered, lora_terms
    from grpocli.generation.weights import policy_weights

    model = _lora_model(torch.float32, use_dora=True)
    with pytest.raises(Uncovered, match="DoRA"):
        lora_terms(model)
    expected, before = _expected(model), {n: t.clone() for n, t in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with policy_weights(model) as weights:
            assert weights.terms == {}
            sent = dict(weights)
    assert any("merged into the base weights in place" in str(w.message) for w in caught)
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert not any(getattr(m, "merged", False) for m in model.modules())
    for name, tensor in before.items():  # float32: peft's W + d - d comes back within rounding
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")  # peft on LoRA over a tied embedding
@pytest.mark.parametrize("why,lora", [
    ("2 active adapters", None),
    ("Embedding adapter layer", {"target_modules": ["embed_tokens", "q_proj"]}),
])
def test_other_adapter_layouts_are_named_when_they_fall_back(why, lora):
    from grpocli.generation.lora import Uncovered, lora_terms

    model = _lora_model(torch.float32, **(lora or {}))
    if lora is None:
        model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["q_proj"]))
        model.base_model.set_adapter(["default", "second"])
    with pytest.raises(Uncovered, match=why):
        lora_terms(model)


@pytest.mark.gpu
def test_lora_syncs_on_a_gpu_leave_the_bf16_base_bit_identical():
    """The same on CUDA, where peft's merge multiplies bf16 adapters in bf16 (no float32 detour)."""
    from grpocli.generation.weights import policy_weights

    model = _lora_model(torch.bfloat16, "bfloat16").to("cuda")
    before = {name: t.clone() for name, t in model.state_dict().items()}
    expected = _expected(model)
    for _ in range(50):
        with policy_weights(model) as weights:
            sent = {name: t.clone() for name, t in weights}
    assert all(torch.equal(model.state_dict()[n], t) for n, t in before.items())
    with policy_weights(model, torch.float32) as weights:
        exact = dict(weights.unique())
    terms = _adapted(before)
    for name, tensor in sent.items():
        assert tensor.device.type == "cuda"
        if name in terms:
            _within_rounding(tensor, expected[name], exact[name], before, name, "bfloat16")
        else:
            assert torch.equal(tensor, expected[name]), name
