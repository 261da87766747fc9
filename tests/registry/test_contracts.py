"""One contract per callable kind: the Protocols of grpocli.registry.hookspecs say what grpo
passes, grpocli.registry.contracts checks a callable against them, the built-ins fit, and the
keywords written in the Protocols are the ones grpo really passes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ROOT

import grpocli
from grpocli.errors import UserError
from grpocli.registry import hookspecs, load_plugins
from grpocli.registry.contracts import (
    CURRICULUM,
    DATASET,
    ENVIRONMENT,
    ENVIRONMENT_RESET,
    ENVIRONMENT_REWARD,
    Resolved,
    check,
    check_tool,
)
from grpocli.registry.names import Registry

HOOKS = {"register_rewards": hookspecs.RewardFunction, "register_datasets": hookspecs.DatasetLoader,
         "register_curricula": hookspecs.Curriculum, "register_tools": hookspecs.Tool,
         "register_environments": hookspecs.EnvironmentFactory}


@pytest.fixture(autouse=True)
def builtins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("GRPO_PLUGINS", raising=False)


def acme(kind: str, fn: Any, name: str = "acme.thing") -> Resolved:
    """``fn`` as plugin 'acme' of distribution 'acme-dist' registers it."""
    registry = Registry(kind)
    registry.registrar("acme", "acme-dist")(name, fn)
    return Resolved.of(kind, registry.get(name))


def refused(*args: Any, **kwargs: Any) -> UserError:
    with pytest.raises(UserError) as info:
        check(*args, **kwargs)
    return info.value


def test_each_hook_points_at_the_protocol_of_what_it_registers() -> None:
    for hook, protocol in HOOKS.items():
        assert protocol.__name__ in getattr(hookspecs, hook).__doc__, hook
        assert protocol.__doc__ and protocol.__call__.__annotations__, protocol  # documented and typed
    assert hookspecs.CURRICULUM_KEYWORDS == ("prompts", "completions", "rewards", "metas", "state", "batch_size",
                                             "next_rows")
    assert hookspecs.DATASET_KEYWORDS == ("split", "seed")
    assert hookspecs.REWARD_KEYWORDS == ("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                                         "log_metric", "log_row_seconds")


def test_the_curriculum_keywords_are_those_the_trainer_passes() -> None:
    """The call that picks the next prompts (trainer/session.py today) passes exactly
    hookspecs.CURRICULUM_KEYWORDS, plus **train.curriculum_args."""
    calls = []
    for path in (ROOT / "grpocli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and {"metas", "next_rows"} <= {k.arg for k in node.keywords}:
                calls.append((path.name, node))
    assert len(calls) == 1, [name for name, _ in calls]
    keywords = [k.arg for k in calls[0][1].keywords]
    assert set(keywords) - {None} == set(hookspecs.CURRICULUM_KEYWORDS) and None in keywords  # None: **args


def test_every_builtin_fits_its_contract() -> None:
    from grpocli.multiturn.builtin import guess_number_dataset
    from grpocli.multiturn.toolbox import tool_from_function

    plugins = load_plugins()
    for entry in plugins.datasets:
        fn = Resolved.of("dataset", entry)
        required = {p: "x" for p in ("path", "id", "env_id") if p in fn.fn.__code__.co_varnames}  # local's, hub's and verifiers'
        check(fn, DATASET, where="data.dataset", args=required, args_where="data.args")
    for entry in plugins.curricula:
        check(Resolved.of("curriculum", entry), CURRICULUM, where="train.curriculum", args={},
              args_where="train.curriculum_args")
    for entry in plugins.tools:
        tool_from_function(entry.fn, "tools[0].name", Resolved.of("tool", entry))
    columns = sorted(guess_number_dataset("train", 0, num_samples=1)[0])
    for entry in plugins.environments:
        env = Resolved.of("environment", entry)
        check(env, ENVIRONMENT, where="multi_turn.environment", args={}, args_where="multi_turn.environment_args")
        instance = entry.fn()
        check(env.at("reset", instance.reset), ENVIRONMENT_RESET, where="multi_turn.environment", columns=columns)
        check(env.at("get_reward", instance.get_reward), ENVIRONMENT_REWARD, where="multi_turn.environment")


def test_a_curriculum_from_the_old_docstring_is_named_with_plugin_function_and_keyword() -> None:
    def hard_first(prompts, completions, rewards, metas, state):  # what registry/hookspecs.py used to say
        return None

    err = refused(acme("curriculum", hard_first), CURRICULUM, where="train.curriculum", args={},
                  args_where="train.curriculum_args")
    assert err.where == "train.curriculum"
    assert err.what.startswith("curriculum 'acme.thing' (test_contracts:")
    assert "hard_first, plugin acme from acme-dist) does not take keyword 'batch_size'" in err.what
    assert "grpocli.registry.hookspecs.Curriculum" in err.hint


def test_kwargs_and_recipe_args_fit_a_curriculum_and_unknown_args_do_not() -> None:
    @grpocli.recipe_args("threshold")
    def loose(**kwargs):
        return None

    check(acme("curriculum", loose), CURRICULUM, where="train.curriculum", args={"threshold": 0.5},
          args_where="train.curriculum_args")
    err = refused(acme("curriculum", loose), CURRICULUM, where="train.curriculum", args={"treshold": 0.5},
                  args_where="train.curriculum_args")
    assert err.where == "train.curriculum_args.treshold" and 'did you mean "threshold"' in err.what

    def needs_level(*, level, **kwargs):
        return None

    err = refused(acme("curriculum", needs_level), CURRICULUM, where="train.curriculum", args={},
                  args_where="train.curriculum_args")
    assert err.where == "train.curriculum_args" and "needs train.curriculum_args.level" in err.what
    check(acme("curriculum", needs_level), CURRICULUM, where="train.curriculum", args={"level": 2},
          args_where="train.curriculum_args")


def test_positional_only_parameters_are_refused_for_every_kind() -> None:
    def loader(split, seed, count, /, **args):
        return []

    err = refused(acme("dataset", loader), DATASET, where="data.dataset", args={"count": 3}, args_where="data.args")
    assert err.where == "data.dataset" and "takes parameter 'split' by position only" in err.what

    def add(a: int, /, b: int) -> int:
        """Add.

        Args:
            a: One.
            b: Two.
        """
        return a + b

    with pytest.raises(UserError, match="'a' by position only") as info:
        check_tool(Resolved("tool", "my_tools:add", add), where="tools[2].name")
    assert info.value.where == "tools[2].name" and info.value.what.startswith("tool 'my_tools:add' takes")


def test_a_tool_needs_a_type_hint_and_no_star_args() -> None:
    def untyped(x) -> str:
        return str(x)

    def star(*values: int) -> int:
        return sum(values)

    with pytest.raises(UserError, match="has no JSON schema: parameter 'x' has no type hint"):
        check_tool(acme("tool", untyped), where="tools[0].name")
    with pytest.raises(UserError, match="takes \\*values") as info:
        check_tool(acme("tool", star), where="tools[0].name")
    assert "plugin acme from acme-dist" in info.value.what


def test_an_environment_method_is_named_with_its_class() -> None:
    class Maze:
        def __init__(self, size: int = 3) -> None:
            self.size = size

        def reset(self, start, **row):
            return None

    env = acme("environment", Maze, "acme.maze")
    check(env, ENVIRONMENT, where="multi_turn.environment", args={"size": 4}, args_where="multi_turn.environment_args")
    err = refused(env.at("reset", Maze().reset), ENVIRONMENT_RESET, where="multi_turn.environment",
                  columns=["prompt", "goal"])
    assert "Maze.reset, plugin acme from acme-dist) requires parameter 'start'" in err.what
    assert "dataset columns: goal, prompt" in err.valid
    check(env.at("reset", Maze().reset), ENVIRONMENT_RESET, where="multi_turn.environment",
          columns=["prompt", "start"])


def test_the_contract_modules_stay_light() -> None:
    probe = ("import sys, grpocli.registry.contracts, grpocli.registry.hookspecs; "
             "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_registry_imports_no_higher_package() -> None:
    for path in (Path(ROOT) / "grpocli" / "registry").glob("*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        for higher in ("grpocli.trainer", "grpocli.multiturn", "grpocli.data", "grpocli.rewards"):
            assert not any(name.startswith(higher) for name in names), (path.name, higher)
