"""Packed micro-batches on a real tiny Qwen2: same log-probs and gradients as unpacked sequences."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpocli.algorithms import LossNorm
from grpocli.algorithms.logprobs import sequence_logprobs
from grpocli.algorithms.packing import Layout, choose_layout, pack_row, pad_rows, tree_mask
from grpocli.generation.base import Sampling
from grpocli.generation.hf import HFBackend
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.recipe.schema import TinyModel
from grpocli.trainer.batching import (
    OptimizerBatch,
    make_micro_batches,
    select_sequences,
)
from grpocli.trainer.rollouts import Advantages, Rollouts
from grpocli.trainer.step import (
    LossSettings,
    global_counts,
    micro_batch_loss,
    packing_stats,
)

TINY = TinyModel(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
SETTINGS = dict(beta=0.0, kl_estimator="k3", temperature=0.7,
                max_completion_length=8)


def model_for(attn: str, tok=None, seed: int = 0):
    return build_tiny_model(TINY, tok or build_char_tokenizer(), seed, attn_implementation=attn)


def rollouts(tok, advantages=(1.0, -1, 1, 0.5, 1, -1, 0.5, -0.5)) -> tuple[Rollouts, Advantages]:
    prompts = ["1+2=", "30+4="]
    texts = ["3", "4<|im_end|>", "33", "12345", "34", "3", "43", "34<|im_end|>"]
    enc = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    n = len(texts)
    return (Rollouts(rows=[{}, {}], prompt_ids=[enc(p) for p in prompts], completion_ids=[enc(t) for t in texts],
                     completions=texts, truncated=torch.zeros(n, dtype=torch.bool), group_size=4),
            Advantages(torch.tensor(advantages, dtype=torch.float32), torch.zeros(2, dtype=torch.bool),
                       torch.ones(n, dtype=torch.bool)))


def micro_batches(r, indices, **kwargs):
    """make_micro_batches of (rollouts, advantages)."""
    return make_micro_batches(r[0], r[1].values, indices, **kwargs)


@torch.no_grad()
def alone(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of the completion from the sequence alone in a batch of one: no packing, no padding."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature  # [Tc, V]
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].float()


def test_pack_row_layout_by_hand():
    # group 0: prompt [10, 11], completions [20, 21] and [30, 31]; group 1: prompt [12], completion [40]
    seqs = [(0, [10, 11], [20, 21]), (0, [10, 11], [30, 31]), (1, [12], [40])]
    shared = pack_row(seqs, share_prompts=True)
    assert shared.input_ids.tolist() == [[10, 11, 20, 30, 12]]  # last completion tokens are not fed
    assert shared.position_ids.tolist() == [[0, 1, 2, 2, 0]]
    assert shared.logit_index.tolist() == [1, 2, 1, 3, 4]        # 20 <- 11, 21 <- 20, 30 <- 11, 31 <- 30, 40 <- 12
    assert shared.labels.tolist() == [[20, 21, 30, 31, 40]]
    assert shared.token_index.tolist() == [[0, 1], [2, 3], [4, 0]]
    assert shared.loss_mask.tolist() == [[1, 1], [1, 1], [1, 0]]
    assert shared.attention_mask is None  # built on the model's device from the tree
    m = tree_mask(shared.tree[0], shared.tree[1])[0, 0]
    assert m[3].tolist() == [True, True, False, True, False]  # 30 sees its prompt and itself, not 20
    assert m[4].tolist() == [False, False, False, False, True]  # group 1 sees only group 1
    plain = pack_row(seqs, share_prompts=False)
    assert plain.input_ids.tolist() == [[10, 11, 20, 10, 11, 30, 12]]
    assert plain.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0]]
    assert plain.attention_mask is None and plain.logit_index.tolist() == [1, 2, 4, 5, 6]
    assert plain.cu_seqlens.tolist() == [0, 3, 6, 7] and plain.max_seqlen == 3  # flash-attention's varlen bounds
    assert shared.cu_seqlens is None
    padded = pad_rows(seqs)
    assert padded.input_ids.tolist() == [[10, 11, 20], [10, 11, 30], [12, 0, 0]]
    assert padded.attention_mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
    assert padded.logit_index.tolist() == [0, 1, 2]               # from the shortest prompt's end
    assert padded.labels.tolist() == [[11, 20, 21], [11, 30, 31], [40, 0, 0]]
    assert padded.token_index.tolist() == [[1, 2], [4, 5], [6, 0]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["shared", "packed", "padded"])
def test_logprobs_in_every_layout_equal_each_sequence_alone(attn, kind):
    tok = build_char_tokenizer()
    model = model_for(attn, tok)
    r, _ = rollouts(tok)
    (mb,) = micro_batches(rollouts(tok), list(range(8)), max_sequences=8, layout=Layout(kind))
    assert mb.input_ids.shape[0] == (8 if kind == "padded" else 1) and mb.num_sequences == 8
    with torch.no_grad():
        logp, entropy = sequence_logprobs(model, mb, 0.7, with_entropy=True)  # [8, T]
    for k, i in enumerate(mb.index.tolist()):
        want = alone(model, r.prompt_ids[i // 4], r.completion_ids[i], 0.7)
        n = len(want)
        torch.testing.assert_close(logp[k, :n], want, rtol=0, atol=2e-5)
        assert (logp[k, n:] == 0).all() and (entropy[k, :n] > 0).all()


def test_packing_without_restarting_positions_would_leak_attention():
    """The check above can fail: the same row read as one long sequence scores differently."""
    tok = build_char_tokenizer()
    model = model_for("sdpa", tok)
    (mb,) = micro_batches(rollouts(tok), list(range(8)), max_sequences=8, layout=Layout("packed"))
    leaky = mb.position_ids.clone()
    leaky[0] = torch.arange(leaky.shape[1])
    with torch.no_grad():
        good, _ = sequence_logprobs(model, mb, 1.0)
        bad, _ = sequence_logprobs(model, dataclasses.replace(mb, position_ids=leaky), 1.0)
    assert (good[1:] - bad[1:]).abs().max() > 1e-3  # every sequence after the first changes


class Wrapped(torch.nn.Module):
    """Holds the model in `.module`, as DistributedDataParallel does (and has no `.config`)."""

    def __init__(self, model):
        super().__init__()
        self.module = model


def test_layout_follows_the_attention_implementation():
    assert choose_layout(model_for("sdpa")) == Layout("shared", max_shared_row=4 * TINY.hidden_size)
    assert choose_layout(Wrapped(model_for("eager"))).kind == "shared"
    flash = model_for("sdpa")
    flash.config._attn_implementation = "flash_attention_2"  # varlen from restarting positions
    assert choose_layout(flash) == choose_layout(Wrapped(flash)) == Layout("packed")
    flash.config._attn_implementation = "flex_attention"      # takes no ready 4D tensor mask
    assert choose_layout(flash) == Layout("padded")


def test_long_shared_rows_are_padded_instead():
    tok = build_char_tokenizer()
    r = rollouts(tok)
    (short,) = micro_batches(r, list(range(8)), max_sequences=8, layout=Layout("shared", max_shared_row=19))
    (long,) = micro_batches(r, list(range(8)), max_sequences=8, layout=Layout("shared", max_shared_row=18))
    assert short.input_ids.shape == (1, 19) and long.input_ids.shape == (8, 8)  # longest: 9 tokens, 8 fed


def test_token_budget_bounds_micro_batches_and_sharing_saves_tokens():
    tok = build_char_tokenizer()
    r = rollouts(tok)
    lengths = [len(r[0].prompt_ids[i // 4]) + len(r[0].completion_ids[i]) for i in range(8)]  # 5 6 6 9 | 7 6 7 8
    mbs = micro_batches(r, list(range(8)), max_sequences=1, max_tokens=14, layout=Layout("shared"))
    assert [mb.index.tolist() for mb in mbs] == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert all(sum(lengths[i] for i in mb.index.tolist()) <= 14 for mb in mbs)
    (unshared,) = micro_batches(r, list(range(8)), max_sequences=8, layout=Layout("packed"))
    (shared,) = micro_batches(r, list(range(8)), max_sequences=8, layout=Layout("shared"))
    # 2 prompts of 4 and 5 tokens, completions of 1,2,2,5 and 2,1,2,3 tokens (18 tokens, 10 fed)
    assert (unshared.row_tokens, shared.row_tokens, shared.sequence_tokens) == (46, 19, 54)
    counts = global_counts(Parallel.alone(), OptimizerBatch((shared,)))
    assert packing_stats(counts) == {"packed_ratio": 1 / 8, "packed_token_ratio": 19 / 54}


def test_zero_advantage_rows_are_counted_but_not_computed():
    """Rows of kept groups all enter the loss; a zero-advantage row (no KL / entropy term) is
    counted with its tokens but needs no forward pass; rows of dropped groups leave entirely."""
    tok = build_char_tokenizer()
    r, adv = rollouts(tok, advantages=(1.0, 0, -1, 0, 0, 0, 0, 0))
    adv.keep[4:] = False
    picked = select_sequences(r, adv)
    assert (picked.computed, picked.idle) == ([0, 2], [1, 3])
    assert picked.idle_tokens == len(r.completion_ids[1]) + len(r.completion_ids[3])
    assert select_sequences(r, adv, skip_zero_advantage=False).computed == [0, 1, 2, 3]
    r.truncated[2] = True
    assert select_sequences(r, adv, mask_truncated=True).computed == [0]
    counted = select_sequences(r, adv, mask_truncated=True, truncated_rows="count")
    assert counted.idle == [1, 2, 3] and counted.idle_tokens == picked.idle_tokens  # no token of row 2
    (mb,) = micro_batches((r, adv), picked.computed, max_sequences=8, layout=Layout("shared"))
    assert mb.index.tolist() == [0, 2] and mb.row_tokens == 4 + 0 + 1  # completions of 1 and 2 tokens


def grads_for(loss: str, kind: str, **layout) -> list[torch.Tensor]:
    """Gradient of the whole batch's loss, summed over the micro-batches of one layout."""
    tok = build_char_tokenizer()
    model = model_for("sdpa", tok)
    mbs = micro_batches(rollouts(tok), list(range(8)), layout=Layout(kind), **layout)
    norm = LossNorm(num_sequences=8, num_tokens=sum(mb.num_tokens for mb in mbs), max_completion_length=8,
                    num_micro_batches=len(mbs))
    for mb in mbs:
        out, _ = micro_batch_loss(model, mb, (None, None, None), LossSettings(loss=loss, **SETTINGS), norm)
        out.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_gradient_does_not_depend_on_token_budget_or_layout(loss):
    reference = grads_for(loss, "padded", max_sequences=1)  # one sequence per micro-batch, no packing
    layouts = [("shared", dict(max_sequences=8)), ("packed", dict(max_sequences=8)),
               ("shared", dict(max_sequences=1, max_tokens=14)), ("shared", dict(max_sequences=1, max_tokens=30)),
               ("packed", dict(max_sequences=1, max_tokens=20)), ("padded", dict(max_sequences=1, max_tokens=25))]
    for kind, layout in layouts:
        for a, b in zip(reference, grads_for(loss, kind, **layout)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_hf_generation_prefills_each_prompt_once_and_samples_the_same():
    tok = build_char_tokenizer()
    model = model_for("sdpa", tok)
    prompts = ["<|im_start|>user\n1+2=<|im_end|>\n", "<|im_start|>user\n300+45=<|im_end|>\n", "7"]
    sampling = Sampling(max_tokens=6, temperature=1.0)
    out, seen = {}, {}
    for shared in (True, False):
        backend = HFBackend(model, tok, max_prompt_length=64, share_prefill=shared)
        shapes = []
        hook = model.model.embed_tokens.register_forward_hook(lambda m, args, o: shapes.append(tuple(args[0].shape)))
        torch.manual_seed(3)
        out[shared] = backend.generate(prompts, 4, sampling)
        hook.remove()
        seen[shared] = shapes
    assert out[True].completion_ids == out[False].completion_ids
    width = max(len(p) for p in out[True].prompt_ids)
    assert seen[True][:2] == [(3, width - 1), (12, 1)]  # 3 prompts once, then 12 rows of 1 token
    assert seen[False][0] == (12, width)                # each prompt 4 times
    assert len(out[True].completion_ids) == 12 and out[True].prompt_ids[2] == tok("7")["input_ids"]
