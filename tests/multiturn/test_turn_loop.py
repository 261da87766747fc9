"""The turn loop on a real tiny model (transformers backend): the whole batch advances turn by
turn, tool turns are spliced in as the chat template's tokens, only the model's tokens enter the
loss (zero gradient from tool tokens), the trainer's log-probs line up with the sequence the model
saw, a hanging tool costs its timeout and no more, and `grpo train` runs a multi-turn recipe."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from cli_runner import run_grpo
from tiny_runs import FAST
from turn_fixtures import ROWS, SAMPLING, chatty_model, echo_loop, recipe, runs

from grpocli.algorithms import LossNorm
from grpocli.algorithms.logprobs import sequence_logprobs
from grpocli.algorithms.packing import Layout
from grpocli.generation.hf import HFBackend
from grpocli.trainer.batching import make_micro_batches
from grpocli.trainer.rollouts import Rollouts
from grpocli.trainer.step import LossSettings, micro_batch_loss

pytestmark = pytest.mark.slow


class CountingHF(HFBackend):
    """The transformers backend, recording the batch of each generate call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int]] = []  # (contexts, n)

    def generate_ids(self, prompt_ids, n, sampling):
        self.calls.append((len(prompt_ids), n))
        return super().generate_ids(prompt_ids, n, sampling)


@pytest.fixture(scope="module")
def sampled():
    torch.manual_seed(0)
    r = recipe()
    model, tok = chatty_model(r)
    backend = CountingHF(model, tok, max_prompt_length=r.data.max_prompt_length)
    loop = echo_loop(r, tok)
    conv = loop.sample(backend, ROWS, r.generation.num_generations, SAMPLING)
    return r, model, tok, loop, backend, conv


def test_every_live_rollout_generates_at_once_turn_by_turn(sampled):
    r, _, _, _, backend, conv = sampled
    turns = [sum(1 for m in msgs if m["role"] == "assistant") for msgs in conv.messages]
    assert max(turns) >= 2 and all(1 <= t <= r.multi_turn.max_turns for t in turns)
    # turn 1: 2 prompts x 3; turn k: one context per rollout that reached turn k
    assert backend.calls[0] == (2, 3)
    assert backend.calls[1:] == [(sum(t > k for t in turns), 1) for k in range(1, max(turns))]
    assert conv.stats.turns == sum(turns) and conv.stats.rollouts == 6
    # calls run = results spliced + results dropped for want of budget (truncated after an EOS)
    dropped = sum(t and ids[-1] == 2 for t, ids in zip(conv.generated.truncated, conv.generated.completion_ids))
    results = sum(1 for msgs in conv.messages for m in msgs if m["role"] == "tool")
    assert conv.stats.calls == results + dropped and results >= 6


def test_tool_turns_are_the_templates_tokens_and_model_turns_end_in_eos(sampled):
    _, _, tok, loop, _, conv = sampled
    for ids, mask, msgs in zip(conv.generated.completion_ids, conv.completion_mask, conv.messages):
        assert len(mask) == len(ids) <= 200
        tool_msgs = [m for m in msgs if m["role"] == "tool"]
        tool_runs = [(s, e) for v, s, e in runs(mask) if v == 0]
        assert len(tool_runs) == len(tool_msgs)
        for (s, e), m in zip(tool_runs, tool_msgs):
            assert ids[s:e] == loop.tool_turns.ids([m])  # spliced as the template renders that turn
            assert ids[s - 1] == tok.eos_token_id        # after a model turn that ended
        model_runs = [(s, e) for v, s, e in runs(mask) if v == 1]
        assert len(model_runs) == sum(1 for m in msgs if m["role"] == "assistant")
        for (s, e), m in zip(model_runs, [m for m in msgs if m["role"] == "assistant"]):
            assert tok.decode(ids[s:e], skip_special_tokens=True) == m["content"]


def _micro_batch(conv, r, layout):
    g = r.generation.num_generations
    rollouts = Rollouts(rows=ROWS, prompt_ids=conv.generated.prompt_ids, completion_ids=conv.generated.completion_ids,
                        completions=[""] * len(conv.completion_mask), truncated=torch.tensor(conv.generated.truncated),
                        group_size=g, completion_mask=conv.completion_mask)
    advantages = torch.tensor([1.0, -1.0, 0.5] * len(ROWS))
    return rollouts, make_micro_batches(rollouts, advantages, list(range(len(conv.completion_mask))), max_sequences=8,
                                        layout=layout)[0]


@pytest.mark.parametrize("layout", [Layout("padded"), Layout("shared")])
def test_loss_mask_and_logprobs_line_up_with_the_sequence_the_model_saw(sampled, layout):
    r, model, _, _, _, conv = sampled
    _, mb = _micro_batch(conv, r, layout)
    logp, _ = sequence_logprobs(model, mb, 1.0)                    # [n, T] the trainer's
    for i, (ids, mask) in enumerate(zip(conv.generated.completion_ids, conv.completion_mask)):
        assert mb.loss_mask[i, : len(mask)].tolist() == [float(m) for m in mask]
        assert mb.loss_mask[i, len(mask):].sum() == 0
        prompt = conv.generated.prompt_ids[i // 3]
        with torch.no_grad():                                      # one plain forward over the whole sequence
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        own = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(logp[i, : len(ids)][own], want[own], atol=1e-5)
        assert (logp[i, : len(ids)][~own] == 0).all()              # tool tokens: not scored


def test_tool_tokens_get_zero_gradient(sampled):
    r, model, _, _, _, conv = sampled
    _, mb = _micro_batch(conv, r, Layout("padded"))
    logp, entropy = sequence_logprobs(model, mb, 1.0, with_entropy=True)
    leaf = logp.detach().requires_grad_(True)                      # d loss / d log-prob of every token
    grpo = recipe("algorithm.loss='grpo'", "algorithm.entropy_coef=0.0")
    settings = LossSettings.of(grpo.algorithm, grpo.generation)
    norm = LossNorm(num_sequences=mb.num_sequences, num_tokens=mb.num_tokens, max_completion_length=200,
                    num_micro_batches=1, world_size=1)
    loss, _ = micro_batch_loss(model, mb, (None, None, None), settings, norm,
                               forward=lambda *a, **k: (leaf, entropy.detach()))
    loss.backward()
    tool = torch.zeros_like(mb.loss_mask, dtype=torch.bool)
    for i, mask in enumerate(conv.completion_mask):
        tool[i, : len(mask)] = torch.tensor(mask) == 0
    assert tool.any() and (leaf.grad[tool] == 0).all()
    assert (leaf.grad[mb.loss_mask > 0] != 0).all()                # every model token does move


def test_completion_lengths_count_the_models_own_tokens(sampled):
    """completions/* count the model's tokens, as TRL's do; mean_total_length adds the tool turns."""
    from dataclasses import replace

    from grpocli.parallel import Parallel
    from grpocli.trainer.metrics import length_metrics

    r, _, _, _, _, conv = sampled
    rollouts, _ = _micro_batch(conv, r, Layout("padded"))
    own = [float(sum(mask)) for mask in conv.completion_mask]
    whole = [float(len(ids)) for ids in conv.generated.completion_ids]
    terminated = [o for o, t in zip(own, conv.generated.truncated) if not t]
    assert sum(own) < sum(whole)                                   # tool turns were spliced in
    acc = Parallel.alone()
    m = length_metrics(acc, rollouts)
    assert m["completions/mean_length"] == pytest.approx(sum(own) / len(own))
    assert (m["completions/min_length"], m["completions/max_length"]) == (min(own), max(own))
    assert m["completions/mean_terminated_length"] == pytest.approx(sum(terminated) / max(len(terminated), 1))
    assert m["completions/mean_total_length"] == pytest.approx(sum(whole) / len(whole))
    single = length_metrics(acc, replace(rollouts, completion_mask=None))  # single-turn: every token
    assert single["completions/mean_length"] == pytest.approx(sum(whole) / len(whole))
    assert "completions/mean_total_length" not in single


def test_a_hanging_tool_costs_its_timeout_and_is_counted(sampled):
    r = recipe("multi_turn.tool_timeout=0.5", "multi_turn.max_turns=2")
    _, model, tok, _, _, _ = sampled

    def stall(text: str) -> str:
        """Never return in time.

        Args:
            text: Ignored.
        """
        released.wait(120)  # far longer than any wait on it could hide in; let go when the test ends
        return "late"

    released = threading.Event()
    loop = echo_loop(r, tok, stall)
    t0 = time.monotonic()
    try:
        conv = loop.sample(HFBackend(model, tok, max_prompt_length=512), ROWS, 3, SAMPLING)
    finally:
        released.set()
    assert time.monotonic() - t0 < 100  # waiting the tool out takes 120 s; this bound holds on a loaded machine
    called = [m for msgs in conv.messages for m in msgs if m["role"] == "tool"]
    assert called and all("timed out" in m["content"] for m in called)
    metrics = conv.stats.metrics()
    assert metrics["tools/timeouts"] == len(called) == metrics["tools/errors"] > 0
    assert metrics["tools/failure_frequency"] == 1.0


def test_grpo_train_runs_a_calculator_recipe(tmp_path):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, 'tools=[{name="calculator"}]', "multi_turn.max_turns=2",
                    "rewards=[{name=\"arithmetic.exact\"}]", f"train.output_dir='{out}'")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    assert len(steps) == 2
    for key in ("tools/call_frequency", "tools/failure_frequency", "tools/errors", "tools/timeouts",
                "multi_turn/turns_per_rollout", "multi_turn/final_answer_ratio", "tools/calls_per_rollout/calculator"):
        assert key in steps[0], key
    assert 1.0 <= steps[0]["multi_turn/turns_per_rollout"] <= 2.0
    rows = [json.loads(x) for x in (out / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(row["conversation"][0]["role"] == "assistant" for row in rows)


def test_an_environment_per_rollout_is_reset_on_its_row_and_scored(sampled):
    from grpocli.multiturn.builtin import (
        GuessNumber,
        environment_reward,
        guess_number_dataset,
    )
    from grpocli.multiturn.parsers import ToolCall
    from grpocli.multiturn.toolbox import Toolbox, tool_from_function
    from grpocli.multiturn.turns import TurnLoop

    r = recipe("multi_turn.environment='guess_number'", "multi_turn.max_turns=3", "tools=[]")
    _, model, tok, _, _, _ = sampled
    box = Toolbox([], environment=GuessNumber, environment_args={"low": 1, "high": 10},
                  environment_tools=[tool_from_function(GuessNumber().guess, "env")])
    loop = TurnLoop(box, tok, r)
    loop.parse, loop.strip = (lambda text: [ToolCall("guess", {"number": 5})]), (lambda text: text)
    rows = guess_number_dataset("train", 0, num_samples=2, low=1, high=10)
    conv = loop.sample(HFBackend(model, tok, max_prompt_length=512), rows, 3, SAMPLING)
    assert len(conv.environments) == 6 and len({id(e) for e in conv.environments}) == 6
    for k, (env, msgs) in enumerate(zip(conv.environments, conv.messages)):
        assert env.secret == rows[k // 3]["secret"]
        answers = [m["content"] for m in msgs if m["role"] == "tool"]
        assert env.guesses >= len(answers)
        assert all(a in ("Higher.", "Lower.", "Correct! The number is 5.", "You already found it: 5.") for a in answers)
    assert environment_reward([], [], environments=conv.environments) == [
        (1.0 if e.solved else 0.0) for e in conv.environments]  # a first guess of 5: 1.0 or unsolved


def test_grpo_train_runs_an_environment_recipe(tmp_path):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, "data.dataset='guess_number'", "data.args={num_samples=32}",
                    "multi_turn.environment='guess_number'", "multi_turn.environment_args={low=1, high=10}",
                    'rewards=[{name="environment.reward"}]', f"train.output_dir='{out}'")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert "rewards/environment.reward/mean" in steps[0] and "tools/calls_per_rollout/guess" in steps[0]
