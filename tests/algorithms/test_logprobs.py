"""Chunked token log-probs / entropy against hand numbers, a naive log_softmax and a real tiny LM."""

import math

import pytest
import torch
import transformers

from grpocli.algorithms import token_entropy, token_logprobs
from grpocli.algorithms.logprobs import sequence_logprobs
from grpocli.algorithms.packing import Layout, build_rows

# One position, vocabulary of 3, logits (0, 0, ln 2): exp -> 1, 1, 2; sum 4; p = .25, .25, .5
HAND = torch.tensor([[[0.0, 0.0, math.log(2.0)]]])  # [N=1, T=1, V=3]


def test_logprobs_by_hand():
    assert token_logprobs(HAND, torch.tensor([[2]])).item() == pytest.approx(math.log(0.5))
    assert token_logprobs(HAND, torch.tensor([[0]])).item() == pytest.approx(math.log(0.25))
    # temperature 2: logits (0, 0, ln2 / 2) -> exp 1, 1, sqrt 2; p(2) = sqrt2 / (2 + sqrt2) = 0.414214
    expected = math.log(math.sqrt(2.0) / (2.0 + math.sqrt(2.0)))  # -0.881374
    assert token_logprobs(HAND, torch.tensor([[2]]), temperature=2.0).item() == pytest.approx(expected, rel=1e-6)


def test_entropy_by_hand():
    # -(2 * 0.25 ln 0.25 + 0.5 ln 0.5) = 0.5 ln 4 + 0.5 ln 2 = 1.5 ln 2 = 1.039721
    assert token_entropy(HAND).item() == pytest.approx(1.5 * math.log(2.0), rel=1e-6)


def _naive(logits, labels, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [N, T, V]
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 5, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunks_match_naive_values_and_gradients(chunk_tokens, temperature):
    torch.manual_seed(0)
    base = torch.randn(3, 6, 11) * 3  # [N, T, V]
    labels = torch.randint(0, 11, (3, 5))
    weights = torch.randn(3, 5)
    # a non-contiguous view, as `logits[:, :-1]` from a model
    mine_in = base.clone().requires_grad_()
    naive_in = base.clone().requires_grad_()
    mine = token_logprobs(mine_in[:, :-1], labels, temperature, chunk_tokens)
    naive, naive_entropy = _naive(naive_in[:, :-1], labels, temperature)
    torch.testing.assert_close(mine, naive)
    torch.testing.assert_close(token_entropy(base[:, :-1], temperature, chunk_tokens), naive_entropy)
    (mine * weights).sum().backward()
    (naive * weights).sum().backward()
    torch.testing.assert_close(mine_in.grad, naive_in.grad)


def test_gradcheck_in_float64():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 5, (2, 3))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, 0.8, 2), (logits,))


def test_bfloat16_logits_give_float32_logprobs_and_bfloat16_gradients():
    torch.manual_seed(2)
    logits = torch.randn(2, 4, 7).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 7, (2, 4))
    out = token_logprobs(logits, labels, chunk_tokens=3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _naive(logits.detach(), labels)[0])
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="disagree"):
        token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))


def _tiny_lm() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=50,
        max_position_embeddings=64,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


SEQUENCES = [(0, [5, 6, 7, 8], [9, 10, 11]), (1, [7, 8], [12, 13, 14, 15])]  # (group, prompt, completion)


@pytest.mark.parametrize("kind", ["padded", "packed", "shared"])
def test_sequence_logprobs_match_a_full_forward_of_each_sequence(kind):
    """Each layout's rows give every completion token's log-prob (and entropy) at the sampling
    temperature, as one forward over that sequence alone does."""
    model = _tiny_lm()
    rows = build_rows(SEQUENCES, Layout(kind))
    logp, entropy = sequence_logprobs(model, rows, 0.9, with_entropy=True)            # [n, T]
    for n, (_, prompt, completion) in enumerate(SEQUENCES):
        full = model(input_ids=torch.tensor([prompt + completion])).logits[0]          # [L, V]
        naive, naive_entropy = _naive(full[len(prompt) - 1 : -1][None], torch.tensor([completion]), 0.9)
        torch.testing.assert_close(logp[n, : len(completion)], naive[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[n, : len(completion)], naive_entropy[0], atol=1e-5, rtol=1e-5)
        assert (logp[n, len(completion) :] == 0).all()  # past the completion: masked
    assert logp.shape == (2, 4) and (logp[rows.loss_mask > 0] < 0).all()


def test_sequence_logprob_gradients_match_the_naive_path():
    model = _tiny_lm().train()
    logp, _ = sequence_logprobs(model, build_rows(SEQUENCES, Layout("padded")), 1.0)
    logp.sum().backward()
    mine = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0
    for _, prompt, completion in SEQUENCES:
        full = model(input_ids=torch.tensor([prompt + completion])).logits              # [1, L, V]
        total = total + _naive(full[:, len(prompt) - 1 : -1], torch.tensor([completion]))[0].sum()
    total.backward()
    for a, p in zip(mine, model.parameters()):
        torch.testing.assert_close(a, p.grad, atol=1e-5, rtol=1e-4)


def test_a_sequence_needs_a_prompt_token():
    with pytest.raises(ValueError, match="empty prompt"):
        build_rows([(0, [], [1, 2])], Layout("padded"))
