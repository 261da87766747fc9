"""Hooks are called through pluggy, one plugin at a time: an implementation may declare any
subset of its hook's arguments, names stay traced to their plugin, and a broken plugin is a
UserError that names it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import pytest

import grpocli
from grpocli.errors import UserError
from grpocli.registry import load_plugins

CALLS: list[str] = []


def plugin(name: str, **hooks: Callable[..., Any]) -> ModuleType:
    """A plugin module named ``name`` holding ``hooks`` (already marked or not)."""
    module = ModuleType(name)
    for hook, fn in hooks.items():
        setattr(module, hook, fn)
    return module


def reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


@pytest.fixture(autouse=True)
def builtins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed entry-point plugins: only the built-ins and the test's own."""
    monkeypatch.setenv("GRPO_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("GRPO_PLUGINS", raising=False)
    CALLS.clear()


def test_hook_without_arguments_and_hook_with_register_only_both_load() -> None:
    @grpocli.hookimpl
    def register_rewards() -> None:  # declares none of the hook's arguments
        CALLS.append("no-args")

    @grpocli.hookimpl
    def register_datasets() -> None:
        CALLS.append("no-args datasets")

    @grpocli.hookimpl(specname="register_rewards")
    def rewards_with_register(register: Callable[..., None]) -> None:
        register("test.mine", reward, description="mine")

    plugins = load_plugins(extra=[
        ("bare", plugin("bare_plugin", register_rewards=register_rewards, register_datasets=register_datasets)),
        ("mine", plugin("mine_plugin", register_rewards=rewards_with_register)),
    ])
    assert CALLS == ["no-args", "no-args datasets"]  # called once each, with nothing
    assert [i.name for i in plugins.loaded][-2:] == ["bare", "mine"]
    assert plugins.registered_by("bare") == {}
    entry = plugins.rewards.get("test.mine")
    assert (entry.plugin, entry.distribution, entry.description) == ("mine", "(local)", "mine")
    assert plugins.registered_by("mine") == {"rewards": ["test.mine"]}
    assert plugins.rewards.get("length").plugin == "grpocli.rewards.builtin"


def test_each_plugin_hook_runs_once_with_its_own_register() -> None:
    @grpocli.hookimpl
    def register_rewards(register: Callable[..., None]) -> None:
        CALLS.append("a")
        register("test.a", reward)

    @grpocli.hookimpl(specname="register_rewards")
    def register_b(register: Callable[..., None]) -> None:
        CALLS.append("b")
        register("test.b", reward)

    plugins = load_plugins(extra=[("a", plugin("a_plugin", register_rewards=register_rewards)),
                                  ("b", plugin("b_plugin", register_rewards=register_b))])
    assert CALLS == ["a", "b"]  # registering b does not call a's hook again
    assert plugins.rewards.get("test.a").plugin == "a" and plugins.rewards.get("test.b").plugin == "b"


def test_duplicate_name_names_both_plugins() -> None:
    @grpocli.hookimpl
    def register_rewards(register: Callable[..., None]) -> None:
        register("length", reward)

    with pytest.raises(UserError, match="registered twice") as info:
        load_plugins(extra=[("dupe", plugin("dupe_plugin", register_rewards=register_rewards))])
    assert "grpocli.rewards.builtin (grpocli)" in info.value.what and "dupe ((local))" in info.value.what


def test_argument_the_hook_does_not_have_is_a_user_error() -> None:
    @grpocli.hookimpl
    def register_rewards(register: Callable[..., None], tokenizer: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(UserError, match="plugin 'future' \\(\\(local\\)\\) could not be registered") as info:
        load_plugins(extra=[("future", plugin("future_plugin", register_rewards=register_rewards))])
    assert "tokenizer" in info.value.what and "subset" in info.value.valid


def test_plugin_that_raises_in_its_hook_is_named() -> None:
    @grpocli.hookimpl
    def register_datasets(register: Callable[..., None]) -> None:
        raise KeyError("oops")

    with pytest.raises(UserError, match="plugin 'buggy' \\(\\(local\\)\\) failed in register_datasets: "
                                        "KeyError: 'oops'") as info:
        load_plugins(extra=[("buggy", plugin("buggy_plugin", register_datasets=register_datasets))])
    assert "GRPO_DISABLE_PLUGIN_AUTOLOAD" in info.value.hint


def test_user_error_from_a_hook_passes_through() -> None:
    @grpocli.hookimpl
    def register_curricula(register: Callable[..., None]) -> None:
        raise grpocli.UserError("no curriculum today", where="plugin picky")

    with pytest.raises(UserError, match="no curriculum today") as info:
        load_plugins(extra=[("picky", plugin("picky_plugin", register_curricula=register_curricula))])
    assert info.value.where == "plugin picky"
