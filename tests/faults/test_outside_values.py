"""Values from outside grpo's code that no float holds (issue 31 item 6): a reward, in process or
served by a real `grpo reward-serve`, returning or logging an integer too large for a float
(10**400: ``float()`` raises OverflowError) is the clear error every other bad reward value is,
never an OverflowError traceback. (The whole `grpo train` command meets one in
test_input_faults.py::test_a_reward_too_large_stops_the_run_naming_the_reward_and_row.)"""

from __future__ import annotations

import textwrap

import pytest
from reward_server_process import RewardServer

from grpocli.errors import UserError
from grpocli.recipe.schema import RewardSpec
from grpocli.registry import load_plugins
from grpocli.rewards import resolve, score
from grpocli.rewards.failures import short

HUGE = '''
def huge(completions, **kwargs):
    """10**400 on row 1: Python's int holds it, a float does not."""
    return [10**400 if i == 1 else 0 for i in range(len(completions))]


def huge_negative(completions, **kwargs):
    return [-(10**5000)] * len(completions)  # past the 4300 digits str() prints, too


def huge_metric(completions, log_metric, **kwargs):
    log_metric("size", 10**400)
    return [0.0] * len(completions)
'''
BATCH = {"prompts": ["a", "b"], "completions": ["x", "y"], "columns": {}}


@pytest.fixture(scope="module")
def huge_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("huge")
    (folder / "huge_rewards.py").write_text(textwrap.dedent(HUGE))
    return folder


@pytest.fixture(scope="module")
def server(huge_dir):
    srv = RewardServer("huge_rewards:huge", "huge_rewards:huge_negative", "huge_rewards:huge_metric", cwd=huge_dir)
    yield srv
    srv.stop()


def _scored(spec: RewardSpec):
    return score(resolve([spec], load_plugins().rewards), BATCH["prompts"], BATCH["completions"], BATCH["columns"])


@pytest.mark.parametrize(("name", "says"), [
    ("huge", "returned a positive integer of about 401 digits (int) at row 1, beyond +-1e+12 (too large for a float)"),
    ("huge_negative", "returned a negative integer of about 5001 digits (int) at row 0"),
])
@pytest.mark.parametrize("where", ["in process", "served"])
def test_an_integer_too_large_for_a_float_is_a_bad_reward_value(huge_dir, server, monkeypatch, where, name, says):
    monkeypatch.syspath_prepend(str(huge_dir))
    spec = (RewardSpec(name=f"huge_rewards:{name}") if where == "in process"
            else RewardSpec(name=f"huge_rewards:{name}", url=server.url, retry_backoff=0.0))
    with pytest.raises(UserError) as info:
        _scored(spec)
    text = info.value.render()
    assert says in text and "rewards[0]" in text and "fix the reward function's return value" in text, text
    if where == "served":
        assert f"on server {server.url}" in text, text


@pytest.mark.parametrize("where", ["in process", "served"])
def test_a_logged_metric_too_large_for_a_float_is_the_rewards_error(huge_dir, server, monkeypatch, where):
    monkeypatch.syspath_prepend(str(huge_dir))
    spec = (RewardSpec(name="huge_rewards:huge_metric", on_error="raise") if where == "in process"
            else RewardSpec(name="huge_rewards:huge_metric", url=server.url, retry_backoff=0.0, on_error="raise"))
    with pytest.raises(UserError) as info:
        _scored(spec)
    text = info.value.render()
    assert "log_metric('size', ...) got a number too large for a float (int)" in text, text
    assert "huge_metric" in text, text


def test_a_value_too_large_to_print_is_still_described():
    assert short(10**5000) == "<a value of type int that cannot be shown>"
    assert short(list(range(10**6))).endswith("19, ...]")  # not a million numbers printed, then cut
