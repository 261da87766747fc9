"""What a multi-turn run records and shows: `grpo inspect RUN --rollouts STEP` prints each
rollout's conversation turn by turn (tool calls, results and errors marked, long text cut), the
completions/* lengths, and algorithm.fill_batch with tools (extra rounds merged, each rollout's
conversation kept with its completion). One real 2-step run of the tiny calculator setup."""

from __future__ import annotations

import json
import textwrap

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

pytestmark = pytest.mark.slow

#: Reward spread in the groups of prompts with an even answer only: the others are flat, so
#: fill_batch has to sample more rounds to find 4 informative groups.
REWARD = '''
def even_answers(prompts, completions, answer, **kwargs):
    return [float(i % 2) if int(a) % 2 == 0 else 0.0 for i, a in enumerate(answer)]
'''
MAX_FILL_ROUNDS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi_turn")
    (root / "even_reward.py").write_text(textwrap.dedent(REWARD))
    out = root / "run"
    done = run_grpo("train", "quickstart", *FAST, 'tools=[{name="calculator"}]', "multi_turn.max_turns=2",
                    f'rewards=[{{name="{root / "even_reward.py"}:even_answers"}}]', "algorithm.fill_batch=true",
                    f"algorithm.max_fill_rounds={MAX_FILL_ROUNDS}", f"train.output_dir='{out}'")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _rollouts(run, step):
    return [json.loads(x) for x in (run / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()]


def _steps(run):
    return [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


def test_inspect_shows_each_rollouts_conversation_turn_by_turn(run):
    done = run_grpo("inspect", str(run), "--rollouts", "1", "--n", "2", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-3000:]
    shown = done.stdout
    assert "rollouts of step 1: 16 completions" in shown
    assert shown.count("[assistant, turn 1]") == 4          # best 2 and worst 2, each its own block
    assert "best 1: reward" in shown and "worst 2: reward" in shown and "prompt (end):" in shown
    ranked = sorted(_rollouts(run, 1), key=lambda r: r["reward"], reverse=True)  # as inspect ranks them
    for r in ranked[:2] + ranked[-2:]:  # the model's own turn, as written
        assert " ".join(r["conversation"][0]["content"].split()) in " ".join(shown.split())


def test_inspect_marks_tool_calls_results_errors_and_cuts_long_text(run):
    """A rollouts file of the run with a conversation that went through tools (step 3: written
    here, in the format write_rollouts writes)."""
    row = dict(_rollouts(run, 1)[0], step=3, reward=1.0)
    long_result = "~" * 380 + "END-OF-RESULT" + "^" * 300
    row["conversation"] = [
        {"role": "assistant", "content": "Let me compute.",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}]},
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1/0"}}},
                        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "9"}}}]},
        {"role": "tool", "name": "calculator", "content": "Error: ZeroDivisionError: division by zero"},
        {"role": "tool", "name": "calculator", "content": long_result},
        {"role": "assistant", "content": "The answer is 408.",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "408"}}}]},
    ]
    (run / "rollouts" / "step-3.jsonl").write_text(json.dumps(row) + "\n")
    done = run_grpo("inspect", str(run), "--rollouts", "3", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    at = lines.index("[assistant, turn 1]")
    assert lines[at:at + 5] == ["[assistant, turn 1]", "Let me compute.", '-> call calculator {"expression": "12*34"}',
                                "[tool calculator]", "408"]
    assert lines[at + 5:at + 8] == ["[assistant, turn 2]", '-> call calculator {"expression": "1/0"}',
                                    '-> call calculator {"expression": "9"}']
    assert lines[at + 8:at + 10] == ["[tool calculator: error]", "Error: ZeroDivisionError: division by zero"]
    text = " ".join(done.stdout.split())
    assert "characters cut" in text and "END-OF-RESULT" not in text   # the middle of a long result is cut,
    assert 200 < text.count("~") < 380 and 100 < text.count("^") < 300  # its start and its end are shown
    assert "[assistant, turn 3] The answer is 408." in text
    assert "(no tool result follows: the rollout ended here)" in text


def test_a_run_logs_the_models_and_the_total_lengths(run):
    for m in _steps(run):
        assert 1 <= m["completions/mean_length"] <= m["completions/mean_total_length"] <= 8
        assert m["completions/min_length"] <= m["completions/mean_length"] <= m["completions/max_length"]


def test_fill_batch_with_tools_keeps_informative_groups_and_their_conversations(run):
    steps = _steps(run)
    assert [m["fill_rounds"] for m in steps] and all(0 <= m["fill_rounds"] <= MAX_FILL_ROUNDS for m in steps)
    assert all(m["multi_turn/turns_per_rollout"] >= 1 for m in steps)
    for step, m in enumerate(steps, start=1):
        rows = _rollouts(run, step)
        assert len(rows) == 16 and all(r["conversation"] for r in rows)
        even = [r["columns"]["answer"] % 2 == 0 for r in rows]
        assert [r["kept"] for r in rows] == even                   # the informative groups enter the loss
        if m["fill_rounds"] < MAX_FILL_ROUNDS:                       # it stopped: enough were found
            assert all(even)
        for r in rows:  # merged and selected with their completions: one turn each, the same text
            if len(r["conversation"]) == 1:
                assert r["conversation"][0]["content"] == r["completion"]
    assert any(m["fill_rounds"] > 0 for m in steps)                 # the rounds were merged at least once
