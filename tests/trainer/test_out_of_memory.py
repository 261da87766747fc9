"""Surviving an out-of-memory (grpocli.trainer.resizing): a real step on a real tiny model, the limit
(train.memory_limit, this process's peak resident set) set between what 16 and 8 sequences a pass take;
the split step equals the unsplit one. The floor and "auto" through the real command line (in this process)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import tomllib
import torch
from accelerate import Accelerator
from cli_runner import grpo_in_process
from tiny_runs import FAST

from grpocli.algorithms.packing import Layout
from grpocli.errors import UserError
from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.recipe.schema import TinyModel
from grpocli.recipe.train_section import TrainSection
from grpocli.trainer.batching import OptimizerBatch, make_micro_batches
from grpocli.trainer.memory_budget import MemoryBudget, OutOfMemory
from grpocli.trainer.resizing import Resizing
from grpocli.trainer.rollouts import Advantages, Rollouts, Scored, Slice
from grpocli.trainer.step import Frozen, LossSettings, frozen_logprobs, optimizer_step

N, G, T = 16, 8, 200
CPU = torch.device("cpu")
SETTINGS = LossSettings(loss="dapo", beta=0.04, kl_estimator="k3", temperature=1.0, max_completion_length=T)


def model(seed=0):
    tok = build_char_tokenizer()
    return build_tiny_model(TinyModel(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256), tok, seed)


@pytest.fixture(scope="module")
def batch():
    """16 completions of 200 tokens in 2 groups, their advantages, and a reference's log-probs."""
    tok = build_char_tokenizer()
    gen = torch.Generator().manual_seed(0)
    prompts = [tok("1+2=", add_special_tokens=False)["input_ids"], tok("30+4=", add_special_tokens=False)["input_ids"]]
    comps = [torch.randint(5, 60, (T,), generator=gen).tolist() for _ in range(N)]
    rollouts = Rollouts(rows=[{}, {}], prompt_ids=prompts, completion_ids=comps, completions=[""] * N,
                        truncated=torch.zeros(N, dtype=torch.bool), group_size=G)
    adv = Advantages(torch.randn(N, generator=gen), torch.zeros(2, dtype=torch.bool), torch.ones(N, dtype=torch.bool))
    mbs = tuple(make_micro_batches(rollouts, adv.values, list(range(N)), max_sequences=N))
    ref = frozen_logprobs(Parallel(Accelerator(cpu=True)), model(seed=1), mbs, 1.0)
    scored = Scored(rollouts, torch.zeros(N), {})
    return Slice(scored, adv, OptimizerBatch(mbs), Frozen(ref_logp=ref), {}, 0.0, 1)


def step(sl: Slice, budget: MemoryBudget | None = None, resizing: Resizing | None = None):
    """One SGD step of a fresh model (the same seed each time): its stats and its parameters after."""
    policy = model()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    p = Parallel(Accelerator(cpu=True))

    def run(x: Slice):
        return optimizer_step(p, policy, optimizer, x.batch, x.frozen, SETTINGS, max_grad_norm=0.0, budget=budget)

    stats = resizing.step(run, sl, layout=Layout(), step=7) if resizing else run(sl)
    return stats, [q.detach().clone() for q in policy.parameters()]


def peak_of(sl: Slice, size: int) -> int:
    watch = MemoryBudget(limit=2**60, device=CPU)
    step(Resizing(TrainSection(micro_batch_size=size), watch, Parallel(Accelerator(cpu=True)), "dapo",
                  print).fitted(sl, Layout()), watch)
    return watch.step_peak


def test_a_step_past_the_limit_is_split_and_equals_the_unsplit_step(batch):
    whole, at_8 = peak_of(batch, N), peak_of(batch, 8)
    assert whole > at_8 + 16 * 2**20, (whole, at_8)  # 16 sequences a pass take clearly more than 8
    limit = (whole + at_8) // 2
    said = []
    resizing = Resizing(TrainSection(micro_batch_size=N, memory_limit=limit), MemoryBudget(limit, CPU),
                        Parallel(Accelerator(cpu=True)), "dapo", said.append)
    split, after = step(batch, resizing.budget, resizing)
    unsplit, expected = step(batch)
    assert resizing.train.micro_batch_size == 8 and resizing.metrics()["memory/oom_splits"] == 1
    assert said and "step 7: out of memory in a training micro-batch of 16 sequence(s)" in said[0]
    assert "train.micro_batch_size 16 -> 8, the step redone" in said[0]
    assert split["loss"] == pytest.approx(unsplit["loss"], rel=1e-5)
    assert split["kl"] == pytest.approx(unsplit["kl"], rel=1e-5)
    for a, b in zip(after, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_log_prob_passes_past_the_limit_get_fewer_sequences(batch):
    said, reference = [], model(seed=1)
    resizing = Resizing(TrainSection(micro_batch_size=N), MemoryBudget(2**60, CPU), Parallel(Accelerator(cpu=True)),
                        "dapo", said.append)
    tries = []

    def run(chunks):  # the first try runs out, as a pass past the device would
        tries.append(chunks)
        if len(tries) == 1:
            raise OutOfMemory("log-prob", N, T + 5)
        return frozen_logprobs(resizing.parallel, reference, batch.batch.micro_batches, 1.0, chunks)

    got = resizing.frozen(run, batch.scored.rollouts, batch.batch.micro_batches, Layout(), step=3)
    assert resizing.train.logprob_micro_batch_size == 8 and [c.num_sequences for c in tries[1]] == [8, 8]
    assert "train.logprob_micro_batch_size 16 -> 8" in said[0]
    torch.testing.assert_close(got[0], batch.frozen.ref_logp[0], rtol=1e-5, atol=1e-6)


def test_one_sequence_past_the_limit_stops_naming_the_step_and_the_knobs(batch):
    one = replace(batch, batch=OptimizerBatch(tuple(make_micro_batches(
        batch.scored.rollouts, batch.advantages.values, [0], max_sequences=1))), frozen=Frozen())
    resizing = Resizing(TrainSection(micro_batch_size=1, memory_limit=2**20), MemoryBudget(2**20, CPU),
                        Parallel(Accelerator(cpu=True)), "dapo", print)
    with pytest.raises(UserError) as caught:
        step(one, resizing.budget, resizing)
    text = caught.value.render()
    assert "step 7: out of memory in a training micro-batch of 1 sequence(s)" in text
    assert "204-token sequence does not fit" in text and "model.gradient_checkpointing = true" in text


def test_bnpo_is_not_split(batch):
    resizing = Resizing(TrainSection(micro_batch_size=N), MemoryBudget(2**20, CPU), Parallel(Accelerator(cpu=True)),
                        "bnpo", print)
    with pytest.raises(UserError, match="divides by each micro-batch's own tokens"):
        resizing.step(lambda sl: (_ for _ in ()).throw(OutOfMemory("training", N, T)), batch, Layout(), 2)


def test_auto_sizes_to_the_limit_and_records_why(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, output = grpo_in_process(monkeypatch, capsys, "train", "quickstart", *FAST, f"train.output_dir={out}",
                                   "train.micro_batch_size=auto", "train.memory_limit=4GiB")
    assert code == 0, output
    config = (out / "config.resolved.toml").read_text()
    size = tomllib.loads(config)["train"]["micro_batch_size"]
    assert size == 16  # every completion of the step: the tiny model fits all of them in 4 GiB
    assert f'# train.micro_batch_size = "auto": {size}: log-prob and training peak' in config
    assert "of 4.00 GiB (train.memory_limit) predicted, " in config and "measured at the first step" in config


@pytest.mark.parametrize("args, said", [
    ([], "no GPU here, and train.memory_limit is not set"),
    (["train.memory_limit=4GiB", "algorithm.loss=bnpo"], "divides by each micro-batch's own tokens"),
])
def test_auto_that_cannot_be_sized_is_refused_before_a_model_loads(args, said):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.autofit import fit_micro_batch

    with pytest.raises(UserError) as caught:
        fit_micro_batch(load_recipe("quickstart", ["train.micro_batch_size=auto", *args]))
    assert said in caught.value.render() and caught.value.where == "train.micro_batch_size"


def test_a_sequence_past_the_limit_in_a_real_run_is_exit_2(tmp_path, monkeypatch, capsys):
    code, output = grpo_in_process(monkeypatch, capsys, "train", "quickstart", *FAST,
                                   f"train.output_dir={tmp_path / 'run'}", "train.micro_batch_size=2",
                                   "train.memory_limit=1MiB")
    assert code == 2, output
    assert "step 1: out of memory in a training micro-batch of 2 sequence(s)" in output  # split once, then the floor
    assert "train.micro_batch_size 2 -> 1, the step redone" in output
    assert "with one sequence a micro-batch already" in output and "Traceback" not in output
