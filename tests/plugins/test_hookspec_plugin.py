"""A third-party plugin written from grpocli/registry/hookspecs.py alone trains: its curriculum,
tool, environment and dataset loader (tests/plugins/grpo_vault) are installed with pip and used
by one `grpo train`. Callables that do not fit their Protocol (tests/plugins/grpo_misfits) are
refused before any model loads: exit 2, no traceback, the plugin, function and parameter named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import install_plugin
from tiny_runs import FAST

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(HERE / "grpo_vault", tmp_path_factory.mktemp("vault") / "site")


@pytest.fixture(scope="module")
def misfits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(HERE / "grpo_misfits", tmp_path_factory.mktemp("misfits") / "site")


def grpo(site: Path, *args: str) -> subprocess.CompletedProcess:
    """`grpo ARGS` with the plugin installed at ``site`` on the path (and no plugin selection set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_PLUGINS", "GRPO_DISABLE_PLUGIN_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return subprocess.run([sys.executable, "-m", "grpocli.cli.app", *args], capture_output=True,
                          text=True, env=env, cwd=site.parent, timeout=300)


def vault_recipe(logs: Path) -> list[str]:
    return [
        "data.dataset=vault.codes", 'tools=[{name="vault.digit_sum"}]', "multi_turn.environment=vault.lock",
        f"multi_turn.environment_args={{max_tries=2, log_path='{logs / 'env.jsonl'}'}}", "multi_turn.max_turns=2",
        "train.curriculum=vault.retry_locked", f"train.curriculum_args={{log_path='{logs / 'curriculum.jsonl'}'}}",
        'rewards=[{name="environment.reward"}]',
    ]


def test_the_vault_plugin_fits_every_contract(vault: Path) -> None:
    done = grpo(vault, "train", "quickstart", *vault_recipe(vault.parent), "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_train_with_the_vault_curriculum_tool_and_environment(vault: Path) -> None:
    out, logs = vault.parent / "run", vault.parent
    done = grpo(vault, "train", "quickstart", *FAST, *vault_recipe(logs), f"train.output_dir='{out}'")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for key in ("rewards/environment.reward/mean", "tools/calls_per_rollout/digit_sum",
                "tools/calls_per_rollout/try_code"):
        assert key in steps[0], key
    # the curriculum got every keyword of hookspecs.Curriculum, after each generation
    calls = [json.loads(line) for line in (logs / "curriculum.jsonl").read_text().splitlines()]
    assert [c["calls"] for c in calls] == list(range(1, len(calls) + 1)) and len(calls) >= 1
    assert calls[0]["batch_size"] == calls[0]["prompts"] == 4 and calls[0]["completions"] == [4] * 4
    assert {"code", "prompt", "prompt_text"} <= set(calls[0]["metas"])
    # one environment per rollout, reset on its row: every column, prompt_text left out
    resets = [json.loads(line)["reset"] for line in (logs / "env.jsonl").read_text().splitlines()]
    assert len(resets) == 2 * 16 and all(r == ["code", "prompt"] for r in resets)


@pytest.mark.parametrize(("overrides", "where", "needles"), [
    (["train.curriculum=misfits.old_curriculum"], "train.curriculum",
     ["curriculum 'misfits.old_curriculum'", "grpo_misfits:old_curriculum", "does not take keyword 'batch_size'"]),
    (["data.dataset=misfits.unseeded", "data.args={}"], "data.dataset",
     ["dataset 'misfits.unseeded'", "grpo_misfits:unseeded", "does not take keyword 'seed'"]),
    (['tools=[{name="misfits.lookup"}]'], "tools[0].name",
     ["tool 'misfits.lookup'", "grpo_misfits:lookup", "parameter 'key' by position only"]),
    (["data.dataset=guess_number", "data.args={num_samples=8}", "multi_turn.environment=misfits.secret_only"],
     "multi_turn.environment",
     ["environment 'misfits.secret_only'", "grpo_misfits:SecretOnly.reset", "does not take keyword 'prompt'"]),
    (["multi_turn.environment=misfits.needs_level"], "multi_turn.environment_args",
     ["environment 'misfits.needs_level'", "grpo_misfits:NeedsLevel", "needs multi_turn.environment_args.level",
      "parameter 'level'"]),
    (["multi_turn.environment=misfits.reward_with_args"], "multi_turn.environment",
     ["grpo_misfits:RewardWithArgs.get_reward", "requires parameter 'scale'"]),
], ids=["curriculum", "dataset-loader", "tool", "environment-reset", "environment-factory", "environment-reward"])
def test_a_callable_that_does_not_fit_its_protocol_is_refused(misfits: Path, overrides, where, needles) -> None:
    done = grpo(misfits, "train", "quickstart", *overrides, "--dry-run")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr
    assert f"{where}: " in done.stderr, done.stderr
    for needle in [*needles, "plugin misfits from grpo-misfits", "grpocli.registry.hookspecs."]:
        assert needle in done.stderr, f"{needle!r} not in:\n{done.stderr}"


def test_a_curriculum_from_the_old_docstring_stops_before_the_model_loads(misfits: Path) -> None:
    """The bug this contract fixes: it used to raise TypeError after the first generation."""
    out = misfits.parent / "run"
    done = grpo(misfits, "train", "quickstart", *FAST, "train.curriculum=misfits.old_curriculum",
                f"train.output_dir='{out}'")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "does not take keyword 'batch_size'" in done.stderr
    assert not (out / "metrics.jsonl").exists()
