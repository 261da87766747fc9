"""Rewards named without a plugin: module:function and path/to/file.py:function (as TRL's CLI).

Registered names keep priority; every mistake is a UserError at `grpo train --dry-run` naming
rewards[i].name, what failed and what is valid.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_runner import assert_clean_error

from grpocli.errors import UserError
from grpocli.registry.names import Registry
from grpocli.rewards import resolve

REWARDS = '''
import grpocli

def reward_len(completions, **kwargs):
    """Closer to 8 characters is better (TRL's reward_len example)."""
    return [-abs(8 - len(c)) / 8 for c in completions]

def scaled(prompts, completions, scale=1.0):
    return [scale * len(c) for c in completions]

NOT_A_FUNCTION = 3
'''


def spec(name, **kw):
    return SimpleNamespace(name=name, weight=kw.get("weight", 1.0), args=kw.get("args", {}), gate=False,
                           on_error="raise", batch_size=kw.get("batch_size"), device=kw.get("device"))


def write_module(folder: Path, module: str, code: str = REWARDS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(textwrap.dedent(code))
    return path


def test_module_function_resolves_with_args_checked_and_its_function_name_as_label(tmp_path, monkeypatch):
    write_module(tmp_path, "grpo_ref_mod_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    import grpo_ref_mod_a

    fns = resolve([spec("grpo_ref_mod_a:reward_len"), spec("grpo_ref_mod_a:scaled", args={"scale": 2.0}),
                   spec("grpo_ref_mod_a:reward_len", weight=0.5)], Registry("reward"))
    assert [f.name for f in fns] == ["reward_len", "scaled", "reward_len#2"]  # TRL's: the function's name
    assert fns[0].fn is grpo_ref_mod_a.reward_len and fns[1].args == {"scale": 2.0} and fns[2].weight == 0.5
    with pytest.raises(UserError, match="takes no argument 'scael'") as info:
        resolve([spec("grpo_ref_mod_a:scaled", args={"scael": 2.0})], Registry("reward"))
    assert "rewards[0].args.scael" in str(info.value) and 'did you mean "scale"' in str(info.value)


def test_file_function_resolves_labelled_by_its_name_qualified_only_where_two_collide(tmp_path, monkeypatch):
    path = write_module(tmp_path / "deep" / "dir", "my_file_rewards")
    fns = resolve([spec(f"{path}:reward_len")], Registry("reward"))
    assert fns[0].name == "reward_len"
    write_module(tmp_path, "grpo_ref_mod_c")
    monkeypatch.syspath_prepend(str(tmp_path))
    both = resolve([spec(f"{path}:reward_len"), spec("grpo_ref_mod_c:reward_len"), spec(f"{path}:scaled")],
                   Registry("reward"))  # two reward_len: each qualified (the file without its directory)
    assert [f.name for f in both] == ["my_file_rewards.py:reward_len", "grpo_ref_mod_c:reward_len", "scaled"]
    assert fns[0].fn(prompts=["p"], completions=["12345678"]) == [0.0]
    # the same file named twice is loaded once
    again = resolve([spec(f"{path}:scaled")], Registry("reward"))
    assert again[0].fn.__module__ == fns[0].fn.__module__


def test_registered_names_keep_priority_and_model_options_need_a_model(tmp_path, monkeypatch):
    write_module(tmp_path, "grpo_ref_mod_b")
    monkeypatch.syspath_prepend(str(tmp_path))

    def registered(completions, **kwargs):
        return [1.0] * len(completions)

    registry = Registry("reward")
    registry.registrar("test", "tests")("grpo_ref_mod_b:reward_len", registered)
    assert resolve([spec("grpo_ref_mod_b:reward_len")], registry)[0].fn is registered
    with pytest.raises(UserError, match="batch_size is set for reward") as info:
        resolve([spec("grpo_ref_mod_b:scaled", batch_size=4)], registry)
    assert "rewards[0].batch_size" in str(info.value)


# -- each mistake through the real command line ------------------------------------------------


@pytest.fixture
def workdir(tmp_path):
    """A working directory with a reward module, a broken one and one with a missing import."""
    write_module(tmp_path, "my_rewards")
    write_module(tmp_path, "broken_rewards", "def reward(completions, **kw)\n    return []\n")
    write_module(tmp_path, "needy_rewards", "import no_such_package_xyz\n\ndef reward(completions, **kw):\n"
                 "    return []\n")
    (tmp_path / "sub").mkdir()
    write_module(tmp_path / "sub", "file_rewards")
    return tmp_path


@pytest.mark.parametrize(("name", "needles"), [
    ("no_such_rewards:reward_len", ["no module named 'no_such_rewards'", "looked in the working directory",
                                    "valid: module.path:function"]),
    ("my_rewards:reward_lne", ["'my_rewards' has no attribute 'reward_lne'", 'did you mean "reward_len"',
                               "valid: my_rewards:NAME with NAME one of: reward_len, scaled"]),
    ("my_rewards:NOT_A_FUNCTION", ["my_rewards:NOT_A_FUNCTION is not callable", "(int)",
                                   "fn(prompts, completions, **kwargs)"]),
    ("my_rewards:", ["'my_rewards:' is not module:function", "valid: module.path:function"]),
    ("broken_rewards:reward", ["importing 'broken_rewards' raised SyntaxError", "broken_rewards.py:1"]),
    ("needy_rewards:reward", ["importing 'needy_rewards' raised ModuleNotFoundError", "no_such_package_xyz",
                              "pip install no_such_package_xyz"]),
    ("sub/missing.py:reward_len", ["no file 'sub/missing.py'", "valid: path/to/file.py:function"]),
    ("sub/file_rewards.py", ["names a file but not the function in it",
                             "valid: sub/file_rewards.py:FUNCTION, where FUNCTION is one of: reward_len, scaled"]),
    ("sub/file_rewards.py:nope", ["has no attribute 'nope'", "reward_len, scaled"]),
    ("./no_such_dir", ["no directory './no_such_dir'", "reward model directory"]),
    ("my_rewards.reward_len", ["unknown reward 'my_rewards.reward_len'", "or a function as module.path:function",
                               "e.g. my_rewards:reward_len"]),
], ids=["no-module", "no-attribute", "not-callable", "no-function", "syntax-error", "missing-dependency",
        "no-file", "file-without-function", "file-no-attribute", "no-directory", "trl-dotted-form"])
def test_each_mistake_is_a_clean_error_at_dry_run(grpo, workdir, name, needles):
    out = grpo("train", "quickstart", f'rewards=[{{name="{name}"}}]', "--dry-run", cwd=workdir)
    assert_clean_error(out, "rewards[0].name", *needles)


def test_dry_run_accepts_module_and_file_functions(grpo, workdir):
    out = grpo("train", "quickstart",
               'rewards=[{name="my_rewards:reward_len"}, {name="sub/file_rewards.py:scaled", args={scale=2}}]',
               "--dry-run", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert 'name = "my_rewards:reward_len"' in out.stdout


FAST = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "train.steps=2",
    "train.micro_batch_size=4", "log.progress=none", "data.args={num_samples=64}",
]


def test_training_with_a_module_function_reward(tmp_path, monkeypatch):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    write_module(tmp_path / "mods", "grpo_ref_train_rewards")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}",
                                     'rewards=[{name="grpo_ref_train_rewards:reward_len"}]']))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert "rewards/reward_len/mean" in metrics[-1]  # TRL's key: the function's name
    assert metrics[-1]["rewards/reward_len/mean"] <= 0.0
