"""`grpo check-rewards`: probe completions scored by real rewards (built-in, TRL's, a user's file)
through the trainer's scoring path; flags; exit 2 for a reward that fails or is constant."""

from __future__ import annotations

import io
import json
import sys
import textwrap

import pytest
from rich.console import Console
from tiny_runs import TINY_MODEL

from grpocli.errors import UserError
from grpocli.evaluation.probe_scores import RewardReport, flags
from grpocli.evaluation.probes import Format, build_probes, detect_format, parse_format, wrong_answer
from grpocli.evaluation.reward_audit import check_rewards

USER_REWARDS = '''
import re

SEEN = []


def reasoning_steps_reward(completions, **kwargs):
    """open-r1's reasoning_steps_reward, as it is: 'Step 1:', numbered or bulleted lines, 'First,' ..."""
    pattern = r"(Step \\d+:|^\\d+\\.|\\n-|\\n\\*|First,|Second,|Next,|Finally,)"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [len(re.findall(pattern, content)) for content in completion_contents]
    return [min(1.0, count / 3) for count in matches]


def constant(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def boom(prompts, completions, **kwargs):
    if any(c == "" for c in completions):
        raise ValueError("cannot score an empty completion")
    return [1.0] * len(completions)


def full(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, solution, **kwargs):
    """TRL 1.16's whole reward signature: records what it gets."""
    SEEN.append({"completion": completions[0], "prompt": prompts[0], "ids": completion_ids[0],
                 "step": trainer_state.global_step, "solution": solution[0]})
    log_extra("seen", [1] * len(completions))
    log_metric("seen", 1.0)
    return [float(len(c[0]["content"])) for c in completions]
'''


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A conversational dataset (TRL's format: prompt messages, a solution column) and a file of rewards."""
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
            for a in range(4) for b in range(4)]
    (tmp_path / "conv.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))
    yield tmp_path
    sys.modules.pop("user_rewards", None)


def run(overrides: list[str], **kwargs):
    out = io.StringIO()
    audit = check_rewards("quickstart", [*TINY_MODEL, "data.args={num_samples=16}", *overrides], rows=4,
                          console=Console(file=out, width=200), **kwargs)
    return audit, out.getvalue()


def by_name(audit):
    return {r.name: r for r in audit.reports}


def test_probes_differ_in_one_thing():
    fmt = Format(("think", "answer"))
    probes = {p.name: p for p in build_probes(["19", "7"], 2, fmt, len, max_tokens=200)}
    assert list(probes) == ["gold", "wrong", "no format", "empty", "long", "repeated"]
    assert probes["gold"].texts[0] == "<think>\nLet me work through the problem step by step.\n</think>\n<answer>\n19\n</answer>"
    assert probes["wrong"].texts[0].endswith("<answer>\n20\n</answer>") and probes["no format"].texts == ["19", "7"]
    assert len(probes["long"].texts[0]) >= 200 and probes["long"].texts[0].endswith("<answer>\n19\n</answer>")
    assert probes["repeated"].texts[1].count("<answer>\n7\n</answer>") == 3
    assert wrong_answer("\\frac{1}{3}", ["\\frac{1}{3}", "x^2"]) == "x^2" and wrong_answer("2.5", []) == "3.5"
    plain = [p.name for p in build_probes(None, 1, Format(), len, max_tokens=8)]
    assert plain == ["formatted", "empty", "long", "repeated"]  # no gold: no wrong; plain: no "no format"
    assert parse_format("answer+think").parts == ("think", "answer") and parse_format("plain").plain
    with pytest.raises(UserError) as err:
        parse_format("xml")
    assert err.value.where == "--format" and "think, answer, boxed" in err.value.valid
    found = detect_format([("data.system_prompt", "Write \\boxed{} at the end")], [])
    assert found.parts == ("boxed",) and found.source == "data.system_prompt"


def kinds(**values):
    return [(f.kind, f.fatal) for f in flags(RewardReport("r", values=values), has_gold=True)]


def test_flags_read_the_probe_means():
    base = {"gold": [1.0, 1.0], "wrong": [0.0, 0.0], "no format": [0.0, 0.0], "empty": [0.0, 0.0]}
    assert kinds(**base, long=[1.0, 1.0], repeated=[1.0, 1.0]) == []
    assert kinds(**base, long=[2.0, 2.0], repeated=[1.0, 1.0]) == [("pays for padding", False)]
    assert kinds(**{**base, "wrong": [1.0, None]}, long=[1.0, 1.0]) == [("returns None", False), ("format alone", False)]
    assert kinds(gold=[0.5, 0.0], wrong=[0.0, 0.5], empty=[0.0, 0.0], long=[0.25, 0.25]) == [
        ("cannot tell right from wrong", False)]
    assert kinds(gold=[None, None], wrong=[None, None]) == [("constant", True)]
    assert kinds(gold=[2.0], wrong=[2.0], empty=[2.0]) == [("constant", True)]
    report = RewardReport("r", values={"gold": [1.0]}, failures={"empty": "raised ValueError"})
    assert [(f.kind, f.fatal) for f in flags(report, has_gold=True)] == [("fails", True)]


def test_builtin_rewards(user_files):
    system = "data.system_prompt='Think in <think> </think>, answer in <answer> </answer>.'"
    rewards = ("rewards=[{name='arithmetic.exact'}, {name='math.accuracy'}, {name='format.strict'}, "
               "{name='length', args={target=8}}]")
    audit, out = run([system, rewards])
    assert audit.fmt.parts == ("think", "answer") and audit.fmt.source == "data.system_prompt and what format.strict checks"
    reports = by_name(audit)
    for name in ("arithmetic.exact", "math.accuracy"):  # right 1, wrong 0: they tell right from wrong
        assert (reports[name].mean("gold"), reports[name].mean("wrong")) == (1.0, 0.0) and not reports[name].flags
    assert reports["format.strict"].mean("repeated") == 0.0
    assert [f.kind for f in reports["format.strict"].flags] == ["format alone"]
    assert [f.kind for f in reports["length"].flags] == ["length alone"]  # quickstart's reward pays for length
    assert "warn length: length alone" in out and "warn format.strict: format alone" in out
    assert "arithmetic.exact" in out and "gold column 'answer'" in out


def test_trl_rewards_get_message_lists(user_files):
    pytest.importorskip("trl.rewards", reason="TRL is not installed")
    import user_rewards

    rewards = ('rewards=[{name="trl.rewards:accuracy_reward"}, {name="trl.rewards:think_format_reward"}, '
               '{name="user_rewards:full", weight=0.01}]')
    audit, out = run([f"data.dataset='{user_files / 'conv.jsonl'}'", "data.args={}", rewards])
    assert audit.gold == "solution" and audit.fmt.parts == ("think", "boxed")  # what TRL's rewards check
    reports = by_name(audit)
    accuracy = reports["accuracy_reward"]
    assert (accuracy.mean("gold"), accuracy.mean("wrong"), accuracy.mean("no format")) == (1.0, 0.0, 0.0)
    assert [f.kind for f in reports["think_format_reward"].flags] == ["format alone"]
    seen = user_rewards.SEEN[0]  # as the trainer calls it: message lists, ids, state, columns
    assert seen["completion"][0]["role"] == "assistant" and seen["prompt"][0]["role"] == "user"
    assert seen["step"] == 0 and seen["solution"] == "0" and len(seen["ids"]) > 0
    assert [f.kind for f in reports["full"].flags] == ["length alone"]  # it scores len(content)
    assert "accuracy_reward" in out and "format think+boxed" in out


def test_constant_and_raising_rewards_exit_2(user_files, grpo):
    done = grpo("check-rewards", "quickstart", *TINY_MODEL, "data.args={num_samples=16}", "--rows", "3",
                'rewards=[{name="user_rewards.py:constant"}, {name="user_rewards.py:boom"}, {name="length"}]',
                cwd=user_files, env={"HF_DATASETS_CACHE": str(user_files / "cache")})
    assert done.returncode == 2, done.stderr
    assert "FAIL constant: constant: returned 0.5 for every probe completion" in done.stdout
    assert "FAIL boom: fails: on probe(s) empty: reward 'boom' raised ValueError: cannot score an empty" in done.stdout
    assert "warn length: length alone" in done.stdout
    assert "rewards[0] (constant), rewards[1] (boom)" in done.stderr and "Traceback" not in done.stderr
    assert "[[rewards]] entry 1" in done.stderr  # the failure's own advice, with boom's real index


def test_a_sound_reward_no_probe_exercises_is_said_so_and_exits_0(user_files, grpo):
    """No probe writes reasoning steps, so open-r1's reward scores them all 0; extra completions that do
    move it, so it is "not exercised" (a warning), not "constant" (exit 2)."""
    done = grpo("check-rewards", "quickstart", *TINY_MODEL, f"data.dataset='{user_files / 'conv.jsonl'}'",
                "data.args={}", "--rows", "3", 'rewards=[{name="user_rewards.py:reasoning_steps_reward"}]',
                cwd=user_files, env={"HF_DATASETS_CACHE": str(user_files / "cache")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("warn reasoning_steps_reward:"))
    assert line.startswith("warn reasoning_steps_reward: not exercised: scored 0 on every probe completion"), line
    assert "'reasoning steps' 1" in line and "--sample N" in line and "constant" not in line


def test_bad_answer_column(user_files):
    with pytest.raises(UserError) as err:
        run([], answer_column="gold_answer")
    assert err.value.where == "--answer-column" and "answer" in err.value.valid


@pytest.mark.slow
def test_sampled_completions_of_the_tiny_model(user_files):
    audit, out = run(["generation.max_completion_length=8", "train.torch_threads=1"], sample=3)
    sampled = next(p for p in audit.probes if p.name == "sampled")
    assert sampled.rows == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3] and all(0 < len(i) <= 8 for i in sampled.ids)
    assert len(by_name(audit)["length"].values["sampled"]) == 12 and "sampled" in out
