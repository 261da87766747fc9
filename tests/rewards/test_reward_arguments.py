"""The [[rewards]] args a reward accepts: named keyword parameters plus @grpocli.recipe_args;
anything else is refused by name, with the accepted args, before a model loads.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from cli_runner import ROOT

import grpocli
from grpocli.errors import UserError
from grpocli.registry import contracts
from grpocli.registry.names import Registry
from grpocli.rewards import resolve
from grpocli.rewards.arguments import accepted_args, check_reward_args
from grpocli.rewards.builtin import BUILTIN_REWARDS
from grpocli.rewards.judge import JudgeArgs


def kw_only(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    return [float(kwargs.get("scale", 1.0))] * len(completions)


@grpocli.recipe_args("scale", "mode")
def declared(prompts: list, completions: list, bonus: float = 0.0, **kwargs: Any) -> list[float]:
    return [float(kwargs.get("scale", 1.0)) + bonus] * len(completions)


def refused(fn, args: dict, name: str = "test.reward", index: int = 0) -> UserError:
    with pytest.raises(UserError) as info:
        check_reward_args(index, name, fn, args)
    return info.value


def test_public_exports_are_the_real_ones() -> None:
    assert grpocli.recipe_args is contracts.recipe_args
    assert grpocli.UserError is UserError
    assert {"hookimpl", "recipe_args", "UserError"} <= set(grpocli.__all__)
    with pytest.raises(AttributeError):
        grpocli.no_such_thing  # noqa: B018


def test_import_grpocli_and_its_exports_stay_light() -> None:
    probe = ("import sys, grpocli; grpocli.recipe_args, grpocli.UserError, grpocli.hookimpl; "
             "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_kwargs_reward_without_marker_takes_no_args() -> None:
    check_reward_args(0, "test.kw", kw_only, {})
    err = refused(kw_only, {"scale": 2}, name="test.kw", index=3)
    assert err.where == "rewards[3].args.scale"
    assert "reward 'test.kw' takes no argument 'scale'" in err.what
    assert err.valid == "(this reward takes no args)"
    assert '@grpocli.recipe_args("name", ...)' in err.hint


def test_marker_adds_to_named_parameters() -> None:
    assert accepted_args(declared) == {"bonus", "scale", "mode"}
    check_reward_args(0, "test.declared", declared, {"scale": 2, "mode": "x", "bonus": 1.0})
    err = refused(declared, {"scael": 2})
    assert 'did you mean "scale"' in err.what
    assert err.valid == "bonus, mode, scale"


def test_plain_function_and_reserved_names() -> None:
    def plain(completions, scale, completion_ids=None):
        return [scale] * len(completions)

    assert accepted_args(plain) == {"scale"}
    assert refused(plain, {"completions": ["x"]}).where == "rewards[0].args.completions"
    assert refused(plain, {"prompts": ["x"]}).valid == "scale"


def test_partial_callable_and_unsignatured_rewards() -> None:
    assert accepted_args(functools.partial(declared, bonus=1.0)) == {"bonus", "scale", "mode"}

    class Scorer:
        def __call__(self, prompts, completions, threshold=0.5, **kwargs):
            return [0.0] * len(completions)

    assert accepted_args(Scorer()) == {"threshold"}
    assert accepted_args(len) == set()  # positional-only: no keyword reaches it


def test_recipe_args_refuses_names_that_are_no_args() -> None:
    for bad in ("not a name", "completions", 3):
        with pytest.raises(TypeError, match="recipe_args takes argument names"):
            grpocli.recipe_args(bad)


def test_builtins_accept_their_args_and_not_the_columns_they_read() -> None:
    accepted = {name: accepted_args(fn) for name, fn in BUILTIN_REWARDS.items()}
    assert accepted == {
        "format.strict": set(), "format.soft": set(), "format.answer_tag": set(), "format.tag_count": set(),
        "reasoning.steps": {"min_steps"}, "length": {"target", "normalize", "target_length"},
        "arithmetic.exact": set(), "countdown.equation": {"format_score"},
        "math.accuracy": {"answer_column"},
        "code.tests": {"tests_column", "mode", "case_timeout", "memory_mb", "max_processes", "file_size_mb", "disk_mb",
                       "workers", "isolation", "python"},
        "judge": set(JudgeArgs.model_fields),
    }


def test_resolve_refuses_a_misspelt_arg_of_a_kwargs_reward() -> None:
    registry = Registry("reward")
    registry.registrar("test", "tests")("test.kw", kw_only)
    spec = SimpleNamespace(name="test.kw", weight=1.0, args={"scale": 2}, gate=False, on_error="raise")
    with pytest.raises(UserError, match="takes no argument 'scale'") as info:
        resolve([spec], registry)
    assert info.value.where == "rewards[0].args.scale"
