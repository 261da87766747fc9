"""train.sequence_parallel = N in `grpo plan` (grpocli.planning.memory): each of the N processes of a split
holds 1/N of every row's tokens (per-token activations, the logits of its scored positions), attention the
whole row for 1/N of the heads (as many elements as its own tokens for every head) under the whole rows'
mask (not divided), beside the all-to-all buffers. Hand-computed figures on a small shape; the refusals of a
split the model or the processes cannot take; train.logits_chunk_tokens read; and the Qwen2.5-7B shape at
1024 + 31744 tokens on 8 GPUs (the figures `grpo plan` prints, recorded)."""

from __future__ import annotations

import io
import json

import pytest
from test_plan import QWEN25

from grpocli.errors import UserError
from grpocli.planning.memory import EXCHANGE_BUFFERS, Settings, Tokens, exchange_bytes, layer_bytes
from grpocli.planning.shapes import ModelShape

GIB = 2**30
#: A small shape: hidden 64, 4 heads of 16, 2 key-value heads, MLP 128, vocabulary 1000.
SMALL = ModelShape(source="test", architecture="Test", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, intermediate_size=128, tied_embeddings=True, params=100_000,
                   embedding_params=64_000, layer_params=18_000, layer_linears=())
#: Qwen2.5-7B's config.json (the numbers of its public config; untied embeddings).
QWEN25_7B = {**QWEN25, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "max_window_layers": 28, "vocab_size": 152064,
             "tie_word_embeddings": False, "sliding_window": 131072}
#: 32K tokens a sequence, FSDP2 over 8 GPUs, gradient checkpointing, bfloat16, micro-batch 1, generation on a
#: vLLM server (the trainer's GPUs train only).
LONG_7B = ["data.max_prompt_length=1024", "generation.max_completion_length=31744", "model.dtype=bfloat16",
           "model.gradient_checkpointing=true", "train.sharding=fsdp2", "train.num_processes=8",
           "train.micro_batch_size=1", "generation.backend=vllm-server"]


def _settings(t: Tokens) -> Settings:
    return Settings(weight_bytes=4, compute_bytes=4, train=t, logprob=t)


def test_per_token_activations_halve_with_two_processes():
    # per token, float32: 6 hidden-sized (6*64*4 = 1536) + q, k, v kept by sdpa without a mask (4 * (2*64 + 2*32))
    # + the MLP's 4 (4 * 4*128) + the norms' rsqrt and the logsumexp of 4 heads (4 * 6) = 4376 bytes
    whole = layer_bytes(SMALL, _settings(Tokens(rows=1, width=1000, scored=900)), Tokens(1, 1000, 900))
    assert whole == 4376 * 1000
    halves = Tokens(rows=1, width=1000, scored=900, split=2)
    assert halves.local == 500 and layer_bytes(SMALL, _settings(halves), halves) == 4376 * 500
    odd = Tokens(rows=2, width=1001, scored=1800, split=2)  # each row padded to 1002, cut in two
    assert odd.local == 2 * 501


def test_the_whole_rows_mask_does_not_divide():
    # with a mask, sdpa keeps k and v repeated to every head: 4 * (2*64 + 2*64) = 1024 instead of 768 a token;
    # the mask (1000^2 elements) is the whole row's on every process, a float32 copy of it per layer
    for n, local in ((2, 500), (4, 250)):
        t = Tokens(rows=1, width=1000, scored=900, mask=1000 * 1000, split=n)
        assert layer_bytes(SMALL, _settings(t), t) == (1536 + 4 * 768 + 24) * local + 4 * 1000 * 1000


def test_the_all_to_all_buffers_and_the_logits_of_a_split():
    t = Tokens(rows=1, width=1000, scored=900, split=2)
    # q and the output (4 heads of 16), k and v (2 heads of 16) for 500 local tokens, float32, send and receive
    assert exchange_bytes(SMALL, _settings(t), t) == EXCHANGE_BUFFERS * (2 * 64 + 2 * 32) * 500 * 4 == 768_000
    assert exchange_bytes(SMALL, _settings(Tokens(1, 1000, 900)), Tokens(1, 1000, 900)) == 0
    assert t.local_scored == 500  # the last slice's 500 positions all score (the prompt is in the first)
    assert Tokens(rows=1, width=1000, scored=300, split=2).local_scored == 300


def _recipe(overrides: list[str], name: str = "quickstart"):
    from grpocli.recipe import load_recipe

    return load_recipe(name, overrides).recipe


def test_the_mask_a_split_passes():
    """grpocli.parallel.sequence.whole_mask: none for right-padded rows under sdpa (is_causal) or flash-attention,
    the whole rows' (padded to a multiple of N) under eager or for shared-prompt rows, on every process."""
    from grpocli.planning import shape_of
    from grpocli.planning.recipe_settings import tokens_of

    base = ["data.max_prompt_length=64", "generation.max_completion_length=1000", "train.micro_batch_size=1",
            "model.tiny.max_position_embeddings=2048"]
    r = _recipe(base)
    shape = shape_of(r.model)
    alone = tokens_of(r, shape, 1)
    assert (alone.rows, alone.width, alone.mask, alone.split) == (1, 1063, 0, 1)  # padded, no padding: is_causal
    padded = tokens_of(_recipe([*base, "train.sequence_parallel=2"]), shape, 2)
    assert (padded.rows, padded.width, padded.mask, padded.local) == (2, 1063, 0, 2 * 532)
    eager = tokens_of(_recipe([*base, "train.sequence_parallel=2", "model.attn_implementation=eager"]), shape, 1)
    assert (eager.mask, eager.local) == (1064 * 1064, 532)
    flash = tokens_of(_recipe([*base, "train.sequence_parallel=2", "model.attn_implementation=flash_attention_2"]),
                      shape, 1)
    assert flash.mask == 0 and flash.local == 532
    short = ["data.max_prompt_length=16", "generation.max_completion_length=64", "train.micro_batch_size=2"]
    shared = tokens_of(_recipe([*short, "train.sequence_parallel=2"]), shape, 2)  # 16 + 2 x 63 tokens, one row
    assert (shared.rows, shared.width, shared.mask, shared.local) == (1, 142, 142 * 142, 71)


def test_a_split_the_heads_or_the_processes_cannot_take_is_refused(tmp_path):
    from grpocli.planning import make_plan, shape_of

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    for n in (3, 8):  # 28 attention heads, 4 key-value heads: 1, 2, 4 divide both
        r = _recipe([*LONG_7B, f"train.sequence_parallel={n}"], "gsm8k_qwen2.5_0.5b")
        with pytest.raises(UserError) as refused:
            make_plan(r, shape_of(r.model, str(tmp_path)), gpus=8, gpu_memory=80 * GIB)
        assert refused.value.where == "train.sequence_parallel"
        assert "28 attention heads, 4 key-value heads" in str(refused.value) and "1, 2, 4" in refused.value.render()
    r = _recipe([*LONG_7B, "train.sequence_parallel=4"], "gsm8k_qwen2.5_0.5b")
    with pytest.raises(UserError, match="does not divide the 6 process"):
        make_plan(r, shape_of(r.model, str(tmp_path)), gpus=6, gpu_memory=80 * GIB)


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory):
    from grpocli.planning import shape_of

    folder = tmp_path_factory.mktemp("qwen2.5-7b")
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    shape = shape_of(_recipe([]).model, str(folder))
    assert shape.params == 7_615_616_512
    return shape


def _plan_7b(shape, n: int, gpu_memory: int, extra: tuple[str, ...] = ()):
    from grpocli.planning import make_plan

    r = _recipe([*LONG_7B, f"train.sequence_parallel={n}", *extra], "gsm8k_qwen2.5_0.5b")
    return make_plan(r, shape, gpus=8, gpu_memory=gpu_memory)


def test_qwen25_7b_at_32k_tokens_on_8_gpus(qwen7b):
    """The figures `grpo plan gsm8k_qwen2.5_0.5b ... --config Qwen2.5-7B --gpus 8 --gpu-memory 80GiB` prints:
    the training phase is the peak, the logits (31744 x 152064 bfloat16, 8.99 GiB) and their gradient most of it
    without a split; each doubling of N halves them (and the checkpointed layer inputs)."""
    peaks, largest = {}, {}
    for n in (1, 2, 4):
        plan = _plan_7b(qwen7b, n, 80 * GIB)
        assert plan.fits and plan.peak.name == "training" and plan.as_dict()["sequence_parallel"] == n
        peaks[n], largest[n] = plan.peak.total / GIB, plan.largest_micro_batch
    assert peaks == pytest.approx({1: 35.92, 2: 23.83, 4: 17.49}, abs=0.01)
    assert largest == {1: 2, 2: 5, 4: 10}
    # on 32 GiB GPUs a row must be split, and the plan says over how many
    alone = _plan_7b(qwen7b, 1, 32 * GIB)
    assert not alone.fits and _plan_7b(qwen7b, 2, 32 * GIB).fits
    assert alone.knobs[0].overrides == ("train.sequence_parallel=2",) and alone.knobs[0].fits
    assert alone.together == ("train.sequence_parallel=2",)


def test_the_plan_says_the_split_it_assumed(qwen7b):
    from rich.console import Console

    from grpocli.planning.report import render

    out = io.StringIO()
    render(_plan_7b(qwen7b, 4, 80 * GIB), Console(file=out, width=400, highlight=False))
    assert ("sequence parallel: train.sequence_parallel = 4: each process holds 1/4 of every row, 8192 of its "
            "32767 tokens, and the logits of 8192 scored positions") in out.getvalue()
    out = io.StringIO()
    render(_plan_7b(qwen7b, 1, 80 * GIB), Console(file=out, width=400, highlight=False))
    assert "train.sequence_parallel = 1" in out.getvalue()


def test_the_plan_reads_train_logits_chunk_tokens(qwen7b):
    """Two float32 blocks of 1024 (or 256) positions beside the logits in the no-grad pass."""
    def block_part(chunk: int) -> int:
        plan = _plan_7b(qwen7b, 1, 80 * GIB, (f"train.logits_chunk_tokens={chunk}",))
        assert plan.settings.chunk_tokens == chunk
        return dict(plan.phases[1].parts)["logits and log-prob block"]

    assert block_part(1024) - block_part(256) == 2 * (1024 - 256) * 152064 * 4
