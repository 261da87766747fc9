"""Ulysses sequence parallelism (train.sequence_parallel) on CPU over gloo: the split step's log-probs,
loss and gradients equal the unsplit step's (DDP over the same processes) within 1e-5 in float32, for
packed rows, a group sharing its prompt and padded rows, on 2 and 4 processes; the refusals; the
attention wrapper leaves a forward without a split unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpocli.algorithms.packing import Layout, build_rows
from grpocli.errors import UserError

HERE = Path(__file__).resolve().parent
TOL = 1e-5


def _split_runs(tmp_path: Path, world: int, splits: str, layouts: str, models: str) -> list[dict]:
    out = tmp_path / "split.json"
    done = subprocess.run([sys.executable, str(HERE / "split_worker.py"), str(out), str(world), splits, layouts, models],
                          capture_output=True, text=True, timeout=900, env={**__import__("os").environ,
                                                                             "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]


def _assert_same(every: list[dict], splits: list[int]) -> int:
    """Each split run against the unsplit one on every process; the number of comparisons."""
    compared = 0
    for rank, results in enumerate(every):
        for key, plain in results.items():
            if not key.endswith("/1"):
                continue
            for n in splits:
                split = results[key[:-1] + str(n)]
                where = f"process {rank}, {key[:-2]}, split {n}"
                assert split["exchanges"] > 0 and plain["exchanges"] == 0, where  # the split really ran
                for a, b in zip(plain["logp"], split["logp"], strict=True):
                    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= TOL, where
                grad = max(abs(x - y) for x, y in zip(plain["grad"], split["grad"], strict=True))
                assert grad <= TOL, (where, grad)
                assert max(abs(x) for x in plain["grad"]) > 1e-3, where  # a gradient to compare
                for figure in ("loss", "grad_norm", "kl", "tokens", "clip"):
                    assert split[figure] == pytest.approx(plain[figure], rel=TOL, abs=TOL), (where, figure)
                assert 0 < plain["clip"] < plain["tokens"], where  # some tokens clipped, not all
                compared += 1
    return compared


def test_two_processes_split_equals_the_unsplit_step(tmp_path):
    every = _split_runs(tmp_path, 2, "2", "packed,shared,padded", "qwen2:sdpa")
    assert _assert_same(every, [2]) == 2 * 3


def test_other_families_attentions_and_grouped_key_values(tmp_path):
    every = _split_runs(tmp_path, 2, "2", "packed", "llama:eager,qwen3:sdpa,qwen2:sdpa:2")
    assert _assert_same(every, [2]) == 2 * 3


@pytest.mark.slow
def test_four_processes_split_in_two_and_in_four(tmp_path):
    """DDP over 2 splits of 2, and one split of 4: processes with 1, 2 and 3 micro-batches."""
    every = _split_runs(tmp_path, 4, "2,4", "packed,shared", "qwen2:sdpa")
    assert _assert_same(every, [2, 4]) == 4 * 2 * 2


def _rows(kind: str):
    seqs = [(0, [5, 6, 7], [8, 9, 10, 11]), (0, [5, 6, 7], [12, 13]), (1, [20, 21], [22, 23, 24, 25, 26])]
    return build_rows(seqs, Layout(kind))


@pytest.mark.parametrize("kind", ["packed", "shared", "padded"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_shards_cover_the_row_and_put_scored_tokens_back(kind, size):
    from grpocli.parallel.sequence import shard_rows

    rows = _rows(kind)
    shards = [shard_rows(rows, size, rank) for rank in range(size)]
    ids = torch.cat([s.input_ids for s in shards], dim=1)
    w = rows.input_ids.shape[1]
    assert ids.shape[1] % size == 0 and torch.equal(ids[:, :w], rows.input_ids)
    assert all(s.input_ids.shape[1] == ids.shape[1] // size for s in shards)
    labels = torch.cat([s.labels for s in shards], dim=1)[:, shards[0].inverse]  # gathered, then put back
    assert torch.equal(labels, rows.labels)
    assert sum(shards[0].counts) == rows.logit_index.numel()
    for rank, s in enumerate(shards):  # each scored position lies in its own slice
        assert s.keep.numel() == s.counts[rank] and (s.keep < s.input_ids.shape[1]).all() and (s.keep >= 0).all()


def _tiny(family="qwen2", heads=4, kv=4, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=heads, num_key_value_heads=kv, head_dim=8, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def test_the_wrapper_leaves_a_forward_without_a_split_unchanged():
    from grpocli.algorithms.packing import attention_implementation
    from grpocli.parallel.ulysses import use_ulysses

    model, ids = _tiny(), torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    before = model(input_ids=ids).logits
    use_ulysses(model)
    assert model.config._attn_implementation == "grpo_ulysses_sdpa"
    assert attention_implementation(model) == "sdpa"  # the layout still follows the model's own attention
    assert torch.equal(model(input_ids=ids).logits, before)
    generated = model.generate(ids[:, :4], max_new_tokens=3, do_sample=False)  # generation goes through it too
    assert generated.shape == (2, 7)


@pytest.mark.parametrize(("model", "size", "said"), [
    (lambda: _tiny(heads=4, kv=2), 4, "does not divide the model's heads (4 attention, 2 key-value)"),
    (lambda: _tiny(heads=6, kv=6), 4, "valid: 2, 3, 6"),
    (lambda: _tiny_gpt2(), 2, "family 'gpt2' is not covered"),
    (lambda: _tiny("mistral", sliding_window=16), 2, "sliding window (16 tokens)"),
])
def test_a_model_the_split_cannot_run_is_refused_by_name(model, size, said):
    from grpocli.parallel.ulysses import check_model

    with pytest.raises(UserError) as caught:
        check_model(model(), size)
    assert said in str(caught.value) and "train.sequence_parallel" in str(caught.value)


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))


def test_a_split_that_does_not_divide_the_processes_stops_before_a_model_loads(monkeypatch, capsys, tmp_path):
    from cli_runner import grpo_in_process
    from tiny_runs import FAST

    code, err = grpo_in_process(monkeypatch, capsys, "train", "quickstart", *FAST, "train.sequence_parallel=2",
                                     f"train.output_dir={tmp_path / 'run'}")
    assert code == 2, err
    assert "train.sequence_parallel = 2 does not divide the 1 training process(es)" in err
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()


def test_a_split_under_deepspeed_names_the_combination():
    from grpocli.parallel import Parallel, open_split

    zero = Parallel.alone()
    zero.sharding = "zero3"  # what grpocli.parallel.deepspeed.DeepSpeed answers
    with pytest.raises(UserError, match="DeepSpeed ZERO3: grpo's Ulysses split runs under DDP and FSDP2 only"):
        open_split(zero, 2)


@pytest.mark.parametrize(("extra", "said"), [
    ("generation.backend=paged", "generation.backend = \"paged\" with train.sequence_parallel = 2"),
    ("train.memory_limit=8GiB", "train.memory_limit with train.sequence_parallel = 2"),
])
def test_what_a_split_does_not_run_with_is_named_before_a_model_loads(extra, said):
    from tiny_runs import FAST

    from grpocli.recipe import load_recipe
    from grpocli.trainer.preflight import preflight

    recipe = load_recipe("quickstart", [*FAST, "train.num_processes=2", "train.sequence_parallel=2", extra]).recipe
    with pytest.raises(UserError, match="with train.sequence_parallel = 2") as caught:
        preflight(recipe)
    assert said in str(caught.value)
