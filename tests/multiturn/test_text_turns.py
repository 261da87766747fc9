"""Environments that answer the model's text turns (``respond(messages)``): feedback spliced in as
user turns of the chat template, the episode ending on None, rewards and the environment's metrics
(env/...) logged in training and in evaluation on held-out prompts (the built-in
'arithmetic_feedback'). The tiny model is real; the 30-minute SmolLM2 run is docs/multi-turn.md's."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from cli_runner import run_grpo
from tiny_runs import FAST
from turn_fixtures import ROWS, SAMPLING, chatty_model, recipe, runs

from grpocli.generation.hf import HFBackend
from grpocli.multiturn.feedback import TOO_HIGH, TOO_LOW, WRONG, ArithmeticFeedback
from grpocli.multiturn.toolbox import Toolbox
from grpocli.multiturn.turns import TurnLoop


class Countdown:
    """Answers each text turn with 'again <k>' and ends the rollout after `replies` answers."""

    def __init__(self, replies: int = 2) -> None:
        self.replies, self.seen = replies, []

    def reset(self, answer: Any = None, **row: Any) -> None:
        self.answer = answer

    def respond(self, messages: list[dict[str, Any]]) -> str | None:
        self.seen.append([dict(m) for m in messages])
        return f"again {len(self.seen)}" if len(self.seen) <= self.replies else None

    def get_reward(self) -> float:
        return float(len(self.seen))

    def get_metrics(self) -> dict[str, float]:
        return {"calls": float(len(self.seen))}


def _said(conversation: list[dict[str, Any]], role: str) -> list[str]:
    return [m["content"] for m in conversation if m["role"] == role]


def test_arithmetic_feedback_judges_each_answer_and_ends_when_right():
    env = ArithmeticFeedback(turn_penalty=0.3)
    env.reset(answer=19, prompt="What is 12 + 7?")
    assert env.respond([{"role": "user", "content": "q"}, {"role": "assistant", "content": "It is 18."}]) == WRONG
    assert env.get_reward() == 0.0 and env.get_metrics() == {"success_first_turn": 0.0, "success": 0.0, "turns": 1.0}
    assert env.respond([{"role": "assistant", "content": "19"}]) is None          # right: the end
    assert env.get_reward() == pytest.approx(0.7)
    assert env.get_metrics() == {"success_first_turn": 0.0, "success": 1.0, "turns": 2.0}
    first = ArithmeticFeedback()
    first.reset(answer="-3")
    assert first.respond([{"role": "assistant", "content": "-3"}]) is None and first.get_reward() == 1.0
    assert first.get_metrics()["success_first_turn"] == 1.0
    hinted = ArithmeticFeedback(hint="direction")
    hinted.reset(answer=10)
    assert [hinted.respond([{"role": "assistant", "content": a}]) for a in ("12", "3", "ten")] == [TOO_HIGH, TOO_LOW, WRONG]


def test_a_respond_that_cannot_take_the_conversation_is_refused_before_any_model_loads():
    from grpocli.errors import UserError
    from grpocli.multiturn.toolbox import check_environment

    class Mute:
        def respond(self) -> None:
            return None

    with pytest.raises(UserError, match=r"respond\(messages\)") as caught:
        check_environment(Toolbox([], environment=Mute), ["prompt"])
    assert caught.value.where == "multi_turn.environment"
    check_environment(Toolbox([], environment=Countdown), ["prompt", "answer"])  # fits: no error


@pytest.mark.slow
def test_an_environment_answers_text_turns_as_user_turns_until_it_returns_none():
    torch.manual_seed(0)
    r = recipe("multi_turn.max_turns=5", "tools=[]")
    model, tok = chatty_model(r)
    loop = TurnLoop(Toolbox([], environment=Countdown, environment_args={"replies": 2}), tok, r)
    conv = loop.sample(HFBackend(model, tok, max_prompt_length=512), ROWS, 3, SAMPLING)
    assert conv.stats.calls == 0 and loop.toolbox.tool_names == []
    for k, (env, msgs, ids, mask) in enumerate(zip(conv.environments, conv.messages, conv.generated.completion_ids,
                                                   conv.completion_mask)):
        turns, replies = _said(msgs, "assistant"), _said(msgs, "user")
        assert replies == [f"again {j}" for j in range(1, len(replies) + 1)]
        assert len(turns) == len(replies) + 1                    # every reply is followed by a model turn
        if not conv.generated.truncated[k]:
            assert len(turns) == 3 and len(env.seen) == 3        # 2 replies, then None ended it (not max_turns)
        # respond saw the prompt's messages, then the rollout's, its last the turn it answers
        assert env.seen[0][0]["role"] == "user" and ROWS[k // 3]["prompt"] in env.seen[0][0]["content"]
        assert all(seen[-1] == {"role": "assistant", "content": t} for seen, t in zip(env.seen, turns))
        user_runs = [(s, e) for v, s, e in runs(mask) if v == 0]  # spliced as the template's user turns
        assert [ids[s:e] for s, e in user_runs] == [loop.tool_turns.ids([{"role": "user", "content": t}])
                                                    for t in replies]
        assert all(ids[s - 1] == tok.eos_token_id for s, _ in user_runs)
    finished = [e for e, t in zip(conv.environments, conv.generated.truncated) if not t]
    assert finished, "no rollout ended within the budget"
    metrics = conv.stats.metrics()
    assert metrics["env/calls"] == pytest.approx(sum(len(e.seen) for e in conv.environments) / 6)
    assert metrics["multi_turn/replies_per_rollout"] == pytest.approx(
        sum(len(_said(m, "user")) for m in conv.messages) / 6)


@pytest.mark.slow
def test_the_last_turn_is_still_shown_to_the_environment_and_its_reply_dropped():
    torch.manual_seed(1)
    r = recipe("multi_turn.max_turns=2", "tools=[]")
    model, tok = chatty_model(r)
    loop = TurnLoop(Toolbox([], environment=Countdown, environment_args={"replies": 5}), tok, r)
    conv = loop.sample(HFBackend(model, tok, max_prompt_length=512), ROWS[:1], 4, SAMPLING)
    assert not all(conv.generated.truncated)
    for env, msgs, truncated in zip(conv.environments, conv.messages, conv.generated.truncated):
        if not truncated:
            assert len(_said(msgs, "assistant")) == 2 and len(env.seen) == 2   # seen, reply dropped
            assert msgs[-1]["role"] == "assistant"


@pytest.mark.slow
def test_grpo_train_logs_both_success_rates_in_training_and_held_out_evaluation(tmp_path):
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, "generation.max_completion_length=48",
                    "multi_turn.environment='arithmetic_feedback'", "multi_turn.max_turns=3",
                    "multi_turn.environment_args={turn_penalty=0.3}", 'rewards=[{name="environment.reward"}]',
                    "eval.every=2", "eval.on_start=true", "eval.num_prompts=4", "eval.n=2",
                    f"train.output_dir='{out}'")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    evals = [x for x in lines if "eval/reward" in x]
    assert len(steps) == 2 and [e["step"] for e in evals] == [0, 2]
    for key in ("env/success_first_turn", "env/success", "env/turns", "rewards/environment.reward/mean",
                "multi_turn/replies_per_rollout"):
        assert key in steps[0], key
    # env/turns counts the answers the environment judged: a turn cut by the budget is not one
    assert 0.0 < steps[0]["env/turns"] <= steps[0]["multi_turn/turns_per_rollout"] <= 3.0
    for key in ("eval/env/success_first_turn", "eval/env/success", "eval/multi_turn/turns_per_rollout"):
        assert key in evals[0], key
    rows = [json.loads(x) for x in (out / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    said = [m["content"] for row in rows for m in row["conversation"] if m["role"] == "user"]
    assert set(said) <= {WRONG} and len(said) / len(rows) == pytest.approx(steps[0]["multi_turn/replies_per_rollout"])
    samples = [json.loads(x) for x in (out / "eval" / "step-0-test" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all({"conversation", "turns", "env"} <= set(s) for s in samples)
    assert all(s["env"]["turns"] == s["turns"] or s["truncated"] for s in samples)


def test_the_call_format_reward_counts_calls_that_ran():
    from grpocli.multiturn.builtin import tool_call_ran

    called = [{"role": "assistant", "content": "", "tool_calls": [{}]}, {"role": "tool", "content": "42"},
              {"role": "assistant", "content": "42"}]
    failed = [{"role": "assistant", "content": ""}, {"role": "tool", "content": "Error: unknown tool 'calc'"}]
    assert tool_call_ran([], [called, failed, [{"role": "assistant", "content": "7"}], "text"]) == [1.0, 0.0, 0.0, None]
