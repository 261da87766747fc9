"""Each row's seconds of a reward (grpocli.rewards.timings): reported by the built-ins that score one
completion at a time, kept by the scorer (a failed batch's rows scored alone too), carried by the
trainer into rollouts/step-N.jsonl ("seconds") and the step's rewards/<name>/slowest_seconds, with a
warning when a row takes more than half of its reward's timeout. In process, real parts, no model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from accelerate import Accelerator

from grpocli.parallel import Parallel
from grpocli.rewards import RewardFn, score
from grpocli.rewards.builtin import math_accuracy
from grpocli.rewards.code_tests import code_tests
from grpocli.rundir import RunDir
from grpocli.trainer.metrics import reward_summary, write_rollouts
from grpocli.trainer.rollouts import Advantages, Rollouts, Scored
from grpocli.wire.rewards import ScoreAnswer

COMPLETIONS = ["<answer>4</answer>", "\\boxed{5}", "<answer>\\frac{1}{2}</answer>", "no idea"]
GOLDS = ["4", "5", "0.5", "7"]
STATE = SimpleNamespace(global_step=0)  # trainer_state: transformers' import is not what is tested


def _rollouts(completions: list[str], group_size: int) -> Rollouts:
    b = len(completions) // group_size
    return Rollouts(rows=[{"prompt": f"p{i}", "prompt_text": f"p{i}"} for i in range(b)],
                    prompt_ids=[[1, 2] for _ in range(b)], completion_ids=[[3, 4]] * len(completions),
                    completions=completions, truncated=torch.zeros(len(completions), dtype=torch.bool),
                    group_size=group_size)


def test_math_accuracy_reports_each_rows_seconds_and_the_step_its_slowest(tmp_path):
    plain = RewardFn("plain", lambda prompts, completions, **kw: [1.0] * len(completions))
    scores = score([RewardFn("math.accuracy", math_accuracy), plain], ["q"] * 4, COMPLETIONS, {"answer": GOLDS}, state=STATE)
    assert scores.per_reward["math.accuracy"] == [1.0, 1.0, 1.0, 0.0]
    rows = scores.row_seconds["math.accuracy"]
    assert len(rows) == 4 and all(isinstance(s, float) and s >= 0 for s in rows), rows
    assert "plain" not in scores.row_seconds  # only its batch time is known: nothing per row is invented

    scored = Scored(_rollouts(COMPLETIONS, 2), torch.tensor(scores.total), scores.per_reward,
                    row_seconds=scores.row_seconds)
    swapped = Scored.concat([scored.select([1]), scored.select([0])])
    assert swapped.row_seconds["math.accuracy"] == rows[2:] + rows[:2]
    parallel = Parallel(Accelerator(cpu=True))
    metrics = reward_summary(parallel, scored)
    assert metrics["rewards/math.accuracy/slowest_seconds"] == max(rows)
    assert "rewards/plain/slowest_seconds" not in metrics
    run = RunDir(tmp_path / "run")
    advantages = Advantages(torch.zeros(4), torch.zeros(2, dtype=torch.bool), torch.ones(4, dtype=torch.bool))
    write_rollouts(run, 1, scored, advantages, parallel)
    records = [json.loads(line) for line in run.rollout_file(1).read_text().splitlines()]
    assert [r["seconds"] for r in records] == [{"math.accuracy": s} for s in rows]


def test_code_tests_reports_each_rows_sandbox_seconds():
    got: list[list[float | None]] = []
    code = "```python\nprint(int(input()) * 2)\n```"
    scores = code_tests(["", "", ""], [code, "no code", code], tests=[{"inputs": ["2"], "outputs": ["4"]}] * 2 + [[]],
                        log_row_seconds=got.append)
    assert scores == [1.0, 0.0, None]
    assert len(got) == 1 and got[0][0] > 0 and got[0][1] > 0 and got[0][2] is None, got  # a row without tests: no run


def test_rows_scored_alone_after_a_failed_batch_have_their_seconds(capsys):
    def flaky(prompts, completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("batch too large")
        return [0.0 if completions[0] == "bad" else 1.0]

    scores = score([RewardFn("flaky", flaky)], ["q"] * 3, ["a", "bad", "c"], {}, state=STATE)
    rows = scores.row_seconds["flaky"]
    assert len(rows) == 3 and all(s is not None and s >= 0 for s in rows), rows
    assert "masked" in capsys.readouterr().err


def test_a_row_past_half_the_timeout_is_warned_about_naming_reward_row_and_key(capsys):
    def reports(prompts, completions, log_row_seconds, **kwargs):
        log_row_seconds([0.1, 3.0, None, "x"])  # None and what is no number: not measured
        return [1.0] * len(completions)

    scores = score([RewardFn("slow", reports, timeout=4.0)], ["q"] * 4, ["a", "b", "c", "d"], {}, state=STATE)
    assert scores.row_seconds["slow"] == [0.1, 3.0, None, None]
    err = capsys.readouterr().err
    assert "reward 'slow' took 3.00 s on row 1" in err and "rewards[0].timeout = 4 s" in err, err
    score([RewardFn("slow", reports, timeout=10.0)], ["q"] * 4, ["a", "b", "c", "d"], {}, state=STATE)
    assert "took" not in capsys.readouterr().err


def test_a_served_rewards_answer_may_carry_row_seconds_and_an_older_one_need_not():
    assert ScoreAnswer.read(b'{"scores": [1, 0], "row_seconds": [0.5, null]}', 2).row_seconds == [0.5, None]
    assert ScoreAnswer.read(b'{"scores": [1, 0]}', 2).row_seconds is None
