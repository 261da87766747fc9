"""A TRL user's reward habits, unchanged: an accuracy reward written the open-r1 / TRL docs way with
math-verify's parse / verify (signal alarms: grpo runs it in the main thread), and reward factories
(TRL's get_soft_overlong_punishment and the like) named in [[rewards]] with args, built once at
load and used under TRL's name for what they make; `grpo train --dry-run` builds and checks them,
and a real `grpo train` run uses them."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.registry.names import Registry
from grpocli.rewards import resolve, score

OVERLONG = 'name="trl.rewards:get_soft_overlong_punishment", args={max_completion_len=8, soft_punish_cache=4}'
ACCURACY = '''
from math_verify import LatexExtractionConfig, parse, verify


def accuracy_reward(completions, answer, **kwargs):
    """The open-r1 / TRL docs way: math-verify's parse and verify with their default timeouts
    (signal alarms, which Python allows only in the main thread)."""
    rewards = []
    for completion, sol in zip(completions, answer):
        content = completion[0]["content"] if isinstance(completion, list) else completion
        gold = parse(f"${sol}$", extraction_config=[LatexExtractionConfig()])
        answer_parsed = parse(content)
        rewards.append(float(verify(gold, answer_parsed)) if gold else None)
    return rewards
'''
REPETITION = 'name="trl.rewards:get_repetition_penalty_reward", args={ngram_size=2, max_penalty=-0.5}'


def _spec(name, **args):
    return SimpleNamespace(name=name, weight=1.0, args=args, gate=False, on_error="raise", timeout=0)


FACTORY = '''
class _Overlong:
    __name__ = "overlong_reward"  # as TRL's factories name what they make

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, completion_ids, **kwargs):
        return [-1.0 if len(ids) > self.limit else 0.0 for ids in completion_ids]


CALLS = []


def get_overlong(limit, scale=1.0):
    CALLS.append(limit)
    return _Overlong(limit)
'''


def test_a_factory_is_built_once_with_its_args_and_named_as_trl_names_its_reward(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(FACTORY)
    fns = resolve([_spec(f"{path}:get_overlong", limit=4)], Registry("reward"))
    assert [(f.name, f.args) for f in fns] == [("overlong_reward", {})]
    ids = [[1] * 3, [1] * 6]
    state = SimpleNamespace(global_step=0)  # a TrainerState's stand-in: importing transformers takes seconds
    for _ in range(2):
        assert score(fns, ["p"] * 2, ["a", "b"], {}, completion_ids=ids, state=state).total == [0.0, -1.0]
    assert sys.modules[fns[0].fn.__module__].CALLS == [4]  # built once, at load


def test_a_factory_without_its_args_or_returning_no_callable_is_named(tmp_path):
    path = tmp_path / "made.py"
    path.write_text(FACTORY + "\n\ndef make(scale):\n    return scale * 2\n")
    with pytest.raises(UserError, match=r"get_overlong makes a reward .* and needs limit, not given"):
        resolve([_spec(f"{path}:get_overlong", scale=2.0)], Registry("reward"))
    with pytest.raises(UserError, match=r"called as a factory with args, and it returned int, not a reward"):
        resolve([_spec(f"{path}:make", scale=3)], Registry("reward"))


@pytest.mark.slow
def test_math_verify_and_trl_factories_pass_dry_run_and_train(tmp_path):
    path = tmp_path / "accuracy.py"
    path.write_text(ACCURACY)
    # the default timeout (300 s): the math-verify reward is first called in a thread of its own
    rewards = f'rewards=[{{name="{path}:accuracy_reward"}}, {{{OVERLONG}}}, {{{REPETITION}}}]'
    checked = run_grpo("train", "quickstart", "--dry-run", *FAST, rewards, timeout=120)
    assert checked.returncode == 0, checked.stderr[-3000:]
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *FAST, "train.steps=1", rewards, f"train.output_dir={out}", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    step = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in line][-1]
    for name in ("accuracy_reward", "soft_overlong_punishment_reward",
                 "repetition_penalty_reward"):
        assert f"rewards/{name}/mean" in step, sorted(step)
