"""Chunked token log-probs / entropy against hand numbers, a naive log_softmax and a real tiny LM."""

import math

import pytest
import torch
import transformers

from grpocli.algorithms import logprobs_from_model, token_entropy, token_logprobs

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


def test_model_logprobs_match_a_full_forward_with_left_padding():
    model = _tiny_lm()
    # prompts of 4 columns (row 1 left-padded by 2), completions of 3 columns
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 7, 8, 12, 13, 14]])  # [N=2, L=7]
    attention_mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    logp, entropy = logprobs_from_model(
        model, input_ids, attention_mask, logits_to_keep=3, temperature=0.9, with_entropy=True, chunk_tokens=2
    )
    full = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [N, L, V]
    # logits at positions 3..5 score the completion tokens at 4..6
    naive, naive_entropy = _naive(full[:, 3:6], input_ids[:, 4:], temperature=0.9)
    torch.testing.assert_close(logp, naive)
    torch.testing.assert_close(entropy, naive_entropy)
    assert logp.shape == (2, 3) and (logp < 0).all()


def test_model_gradients_match_the_naive_path():
    model = _tiny_lm().train()
    input_ids = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    logp, _ = logprobs_from_model(model, input_ids, logits_to_keep=4, chunk_tokens=3)
    logp.sum().backward()
    mine = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    naive, _ = _naive(model(input_ids=input_ids).logits[:, 1:5], input_ids[:, 2:])
    naive.sum().backward()
    for a, p in zip(mine, model.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_packed_rows_with_position_ids_match_separate_rows():
    model = _tiny_lm()
    first, second = [3, 4, 5, 6], [7, 8, 9]
    separate = [
        logprobs_from_model(model, torch.tensor([seq]), logits_to_keep=len(seq) - 1)[0][0]
        for seq in (first, second)
    ]
    packed_ids = torch.tensor([first + second])  # [1, 7]
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    packed, _ = logprobs_from_model(model, packed_ids, None, logits_to_keep=6, position_ids=position_ids)
    # packed[0, j] scores token j + 1: tokens 1..3 are `first`, token 4 starts `second` (no
    # logprob of its own), tokens 5..6 are the rest of `second`
    torch.testing.assert_close(packed[0, :3], separate[0])
    torch.testing.assert_close(packed[0, 4:], separate[1])
    # without the restarting positions, `second` attends to `first`: the numbers change
    unpacked, _ = logprobs_from_model(model, packed_ids, None, logits_to_keep=6)
    assert not torch.allclose(unpacked[0, 4:], separate[1])


def test_logits_to_keep_must_leave_a_context_token():
    model = _tiny_lm()
    with pytest.raises(ValueError, match="logits_to_keep"):
        logprobs_from_model(model, torch.tensor([[1, 2, 3]]), logits_to_keep=3)
