"""A plugin hook that calls sys.exit(): named with its module, exit 2 by the CLI, instead of grpo
ending with the plugin's exit code and no word. (A plugin whose import does it, installed for real
with pip: test_reward_faults.py.)"""

from __future__ import annotations

import sys
import types

import pytest

import grpocli
from grpocli.errors import UserError
from grpocli.registry.manager import load_plugins


def test_a_plugin_hook_that_calls_sys_exit_is_named(monkeypatch):
    monkeypatch.setenv("GRPO_DISABLE_PLUGIN_AUTOLOAD", "1")  # only the built-ins and this one
    plugin = types.ModuleType("grpo_quitter_hook")

    @grpocli.hookimpl
    def register_rewards(register):
        sys.exit(4)

    plugin.register_rewards = register_rewards
    with pytest.raises(UserError) as info:
        load_plugins(extra=[("quitter", plugin)])
    text = str(info.value)
    assert "plugin 'quitter' ((local), grpo_quitter_hook) called sys.exit(4) in register_rewards" in text, text
    assert "GRPO_DISABLE_PLUGIN_AUTOLOAD=1" in text and info.value.exit_code == 2
