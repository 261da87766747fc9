"""Environments written in other libraries' formats: verifiers (classic API: vf.SingleTurnEnv,
vf.MultiTurnEnv with env_response and @vf.stop, vf.Rubric; loaded by id) and OpenEnv (openenv-core's
Environment with reset/step and pydantic Action/Observation), run by grpo's turn loop. The
environments are real ones, in tests/multiturn/envpkgs; the training runs use the real tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("openenv")

from cli_runner import run_grpo
from tiny_runs import TINY_MODEL

from grpocli.errors import UserError

ENVPKGS = Path(__file__).parent / "envpkgs"
RUN = [*TINY_MODEL, "generation.max_completion_length=32", "generation.num_generations=4", "train.prompts_per_step=2",
       "train.steps=2", "train.micro_batch_size=4", "log.progress=none", "log.rollouts_every=1",
       "train.torch_threads=1", 'rewards=[{name="environment.reward"}]']


@pytest.fixture
def envpkgs(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVPKGS))
    monkeypatch.chdir(ENVPKGS)


def _said(row: dict[str, Any], role: str) -> list[str]:
    return [m["content"] for m in row["conversation"] if m["role"] == role]


def test_a_single_turn_verifiers_env_scores_the_answer_with_its_rubric(envpkgs):
    from grpocli.data.verifiers_datasets import verifiers_dataset
    from grpocli.multiturn.verifiers_rollouts import factory_for

    rows = verifiers_dataset(split="train", seed=0, env_id="vf_say_answer", num_samples=3)
    assert len(rows) == 3 and rows[1]["prompt"][0] == {"role": "system", "content": "Answer with a number."}
    env = factory_for("verifiers:vf_say_answer", "multi_turn.environment")(num_samples=3)
    env.reset(**rows[1])
    assert env.respond([*rows[1]["prompt"], {"role": "assistant", "content": "1"}]) is None  # max_turns=1
    assert env.get_metrics() == {"said_answer": 1.0, "short": 0.5, "num_turns": 1.0}
    assert env.get_reward() == pytest.approx(1.0 + 0.5 * 0.5)                   # the rubric's weights


def test_a_verifiers_env_dataset_loads_through_data_dataset(envpkgs):
    from grpocli.data.source import load_dataset_for, resolve
    from grpocli.recipe.schema import DataSection
    from grpocli.registry import load_plugins

    data, registry = DataSection(dataset="verifiers:vf_say_answer", args={"num_samples": 2}), load_plugins().datasets
    entry, args = resolve(data, registry)
    assert entry.name == "verifiers" and args == {"env_id": "vf_say_answer", "num_samples": 2}
    rows = load_dataset_for(data, registry, "train", 0)
    assert rows["answer"] == ["0", "1"] and rows[0]["prompt"][-1] == {"role": "user", "content": "Say the number 0."}


def test_a_multi_turn_verifiers_env_answers_until_its_stop_condition(envpkgs):
    from grpocli.data.verifiers_datasets import verifiers_dataset
    from grpocli.multiturn.verifiers_rollouts import factory_for

    row = verifiers_dataset(split="train", seed=0, env_id="vf_guess_game", num_samples=2)[1]
    env = factory_for("verifiers:vf_guess_game", "multi_turn.environment")(num_samples=2)
    env.reset(**row)
    talk = [*row["prompt"], {"role": "assistant", "content": "apple?"}]
    assert env.respond(talk) == "Not yet. Guess again: (1)"                      # env_response
    talk += [{"role": "user", "content": "Not yet. Guess again: (1)"}, {"role": "assistant", "content": "word1"}]
    assert env.respond(talk) is None                                            # @vf.stop guessed
    assert env.get_metrics() == {"won": 1.0, "turns": 2.0, "num_turns": 2.0} and env.get_reward() == 1.0
    capped = factory_for("verifiers:vf_guess_game", "multi_turn.environment")(num_samples=2, max_turns=1)
    capped.reset(**row)
    assert capped.respond(talk[:2]) is None and capped.get_reward() == 0.0     # max_turns reached


def test_an_openenv_env_steps_on_each_turn_until_done(envpkgs):
    from grpocli.multiturn.openenv_env import factory_for

    env = factory_for("openenv:openenv_counter:CounterEnvironment", "multi_turn.environment")(steps=2)
    assert env.reset(prompt="12+7=", answer=19) == " Board ready, say something."
    assert env.respond([{"role": "assistant", "content": "abc"}]) == "You said 3 characters (step 1)."
    assert env.respond([{"role": "assistant", "content": "a"}]) is None       # done after 2 steps
    assert env.get_reward() == pytest.approx(1 / 4 + 1 / 2)                    # the return
    assert env.get_metrics() == {"steps": 2.0, "done": 1.0}


def test_missing_libraries_and_environments_are_named_before_any_model_loads(envpkgs, monkeypatch):
    from grpocli.multiturn.openenv_env import factory_for as openenv_factory
    from grpocli.multiturn.verifiers_rollouts import factory_for

    with pytest.raises(UserError, match="no verifiers environment 'no_such_env'") as err:
        factory_for("verifiers:no_such_env", "multi_turn.environment")
    assert "vf-install no_such_env" in err.value.hint
    with pytest.raises(UserError, match="not an OpenEnv Environment class"):
        openenv_factory("openenv:openenv_counter:CounterAction", "multi_turn.environment")
    monkeypatch.setitem(sys.modules, "verifiers", None)                          # as if not installed
    monkeypatch.setattr("grpocli.data.verifiers_datasets._LOADED", {})
    with pytest.raises(UserError, match="verifiers package is not installed") as err:
        factory_for("verifiers:vf_say_answer", "multi_turn.environment")
    assert "grpocli[envs]" in err.value.hint
    monkeypatch.setitem(sys.modules, "openenv.core.env_server.interfaces", None)
    with pytest.raises(UserError, match="openenv-core is not installed") as err:
        openenv_factory("openenv:openenv_counter:CounterEnvironment", "multi_turn.environment")


def test_grpo_train_refuses_an_unknown_verifiers_env_with_exit_2():
    done = run_grpo("train", "quickstart", "--dry-run", "multi_turn.environment='verifiers:no_such_env'",
                    cwd=ENVPKGS, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no verifiers environment 'no_such_env'" in done.stderr and "Traceback" not in done.stderr


def _train(tmp_path: Path, *overrides: str) -> tuple[list[dict], list[dict]]:
    out = tmp_path / "run"
    done = run_grpo("train", "quickstart", *RUN, *overrides, f"train.output_dir='{out}'", cwd=ENVPKGS)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for k in (1, 2) for x in (out / "rollouts" / f"step-{k}.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s] == [1, 2]
    return steps, rows


@pytest.mark.slow
def test_grpo_train_on_a_single_turn_verifiers_env_and_its_dataset(tmp_path):
    steps, rows = _train(tmp_path, "data.dataset='verifiers:vf_say_answer'", "data.args={num_samples=4}",
                         "multi_turn.environment='verifiers:vf_say_answer'", "multi_turn.environment_args={num_samples=4}")
    for key in ("rewards/environment.reward/mean", "env/said_answer", "env/short", "env/num_turns"):
        assert key in steps[0], key
    assert all(_said(r, "user") == [] for r in rows)                             # single turn: no reply
    assert {r["columns"]["answer"] for r in rows} <= {"0", "1", "2", "3"}       # the env's own dataset
    finished = [r for r in rows if not r["truncated"]]
    for r in finished:  # its rubric scored what the model said: 1 * said_answer + 0.5 * short
        text = r["conversation"][-1]["content"]
        expected = float(r["columns"]["answer"] in text) + 0.5 / (1 + len(text))
        assert r["rewards"]["environment.reward"] == pytest.approx(expected, rel=1e-5)
    assert any(s["rewards/environment.reward/mean"] > 0 for s in steps if "loss" in s)


@pytest.mark.slow
def test_grpo_train_on_a_multi_turn_verifiers_env_logs_its_replies(tmp_path):
    steps, rows = _train(tmp_path, "data.dataset='verifiers:vf_guess_game'", "data.args={num_samples=4}",
                         "multi_turn.environment='verifiers:vf_guess_game'", "multi_turn.max_turns=3",
                         "multi_turn.environment_args={num_samples=4}", "generation.max_completion_length=128")
    for key in ("rewards/environment.reward/mean", "env/won", "env/turns", "multi_turn/replies_per_rollout"):
        assert key in steps[0], key
    replies = [t for r in rows for t in _said(r, "user")]
    assert replies, "no rollout ended a turn within the budget"                 # the tiny model ends ~1 turn in 3
    assert all(t.startswith("Not yet. Guess again: (") for t in replies)        # env_response, spliced in


@pytest.mark.slow
def test_grpo_train_on_an_openenv_env_with_its_observations_and_return(tmp_path):
    steps, rows = _train(tmp_path, "multi_turn.environment='openenv:openenv_counter:CounterEnvironment'",
                         "multi_turn.environment_args={steps=2}", "multi_turn.max_turns=3", "data.args={num_samples=8}",
                         "generation.max_completion_length=128")
    for key in ("rewards/environment.reward/mean", "env/steps", "env/done"):
        assert key in steps[0], key
    replies = [t for r in rows for t in _said(r, "user")]
    assert replies and all(t.startswith("You said ") for t in replies)          # step's observation
    for r in (r for r in rows if _said(r, "user")):  # the model's turn was the Action; the return sums steps
        said, first = _said(r, "assistant"), 1 / (1 + len(_said(r, "assistant")[0]))
        assert _said(r, "user")[0] == f"You said {len(said[0])} characters (step 1)."
        both = first + 1 / (1 + len(said[1]))
        assert r["rewards"]["environment.reward"] == pytest.approx(first) or \
            r["rewards"]["environment.reward"] == pytest.approx(both)
    assert any(r["rewards"]["environment.reward"] > 0 for r in rows), "no rollout reached a step"
