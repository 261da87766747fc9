"""The example third-party plugin plugins/grpo-reasoning-gym: installed for real with pip into a
temporary directory (the venv is not touched) and found through its ``grpo`` entry point, and
its dataset loader and reward used in-process on reasoning-gym's real generators, offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import install_plugin

from grpocli.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "plugins" / "grpo-reasoning-gym"
DIST = "grpo-reasoning-gym"
COLUMNS = ("rg_task", "rg_entry", "rg_config", "rg_index")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin installed with ``pip install --target`` (cli_runner.install_plugin)."""
    return install_plugin(PLUGIN_DIR, tmp_path_factory.mktemp("site"))


def _run(target: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_PLUGINS", "GRPO_DISABLE_PLUGIN_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT)])
    env["COLUMNS"] = "250"  # rich wraps table cells to the terminal width
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=target, timeout=120)


def test_pip_installed_plugin_is_found_by_entry_point(installed: Path) -> None:
    script = textwrap.dedent("""
        import json
        import grpo_reasoning_gym
        from grpocli.registry import load_plugins
        p = load_plugins()
        ds = p.datasets.get("reasoning_gym")
        rw = p.rewards.get("reasoning_gym.score")
        rows = ds.fn(split="train", seed=0, task="chain_sum", size=4)
        cols = {k: rows[k] for k in ("rg_task", "rg_entry", "rg_config", "rg_index")}
        good = rw.fn(rows["prompt"], ["<answer>%s</answer>" % a for a in rows["answer"]], **cols)
        print(json.dumps({"dataset": ds.distribution, "reward": rw.distribution,
                          "file": grpo_reasoning_gym.__file__, "scores": good,
                          "loaded": [i.distribution for i in p.loaded]}))
    """)
    done = _run(installed, ["-c", script])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["dataset"] == DIST and out["reward"] == DIST
    assert DIST in out["loaded"]
    assert Path(out["file"]).is_relative_to(installed)  # the installed copy, not the source
    assert out["scores"] == [1.0, 1.0, 1.0, 1.0]


def test_cli_lists_the_installed_plugin(installed: Path) -> None:
    if importlib.util.find_spec("grpocli.cli.app") is None:
        pytest.skip("grpocli.cli.app is not written yet")
    done = _run(installed, ["-m", "grpocli.cli.app", "inspect", "plugins"])
    assert done.returncode == 0, done.stderr
    assert DIST in done.stdout
    assert "reasoning_gym.score" in done.stdout


@pytest.fixture
def rg(monkeypatch: pytest.MonkeyPatch):
    """The plugin package from its source directory, with every socket connection refused."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network use: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    from grpo_reasoning_gym import scorer, tasks

    return tasks, scorer


def _columns(rows) -> dict:
    return {k: rows[k] for k in COLUMNS}


def test_loader_makes_rows_and_splits_differ(rg) -> None:
    tasks, _ = rg
    train = tasks.load(split="train", seed=0, task="basic_arithmetic", size=50, max_terms=3)
    again = tasks.load(split="train", seed=0, task="basic_arithmetic", size=50, max_terms=3)
    test = tasks.load(split="test", seed=0, task="basic_arithmetic", size=50, max_terms=3)
    assert len(train) == 50
    assert set(train.column_names) == {"prompt", "answer", *COLUMNS}
    assert train["prompt"] == again["prompt"]  # deterministic for a (seed, split)
    assert train["prompt"] != test["prompt"]
    entry = json.loads(train[0]["rg_entry"])
    assert entry["question"] == train[0]["prompt"] and entry["answer"] == train[0]["answer"]
    assert entry["metadata"]["num_terms"] <= 3  # the extra config reached reasoning-gym
    assert set(train["rg_task"]) == {"basic_arithmetic"}


def test_score_is_reasoning_gyms_verdict(rg) -> None:
    tasks, scorer = rg
    rows = tasks.load(split="train", seed=1, task="leg_counting", size=3)
    answers = rows["answer"]
    right = [
        f"<think>count</think>\n<answer> {answers[0]} </answer>",
        answers[1],  # no tag: the whole completion is the answer
        [{"role": "assistant", "content": f"<answer>{answers[2]}</answer>"}],
    ]
    assert scorer.score(rows["prompt"], right, **_columns(rows)) == [1.0, 1.0, 1.0]
    wrong = [f"<answer>{int(a) + 1}</answer>" for a in answers]
    assert all(s < 1.0 for s in scorer.score(rows["prompt"], wrong, **_columns(rows)))
    strict = scorer.score(rows["prompt"], right, strict=True, **_columns(rows))
    assert strict == [1.0, 0.0, 1.0]


def test_score_uses_the_regenerated_entry(rg) -> None:
    # arc_agi compares against tuples in metadata, which JSON turns into lists: scoring the
    # JSON entry alone gives 0.05 for a correct answer, the regenerated entry gives 1.0.
    tasks, scorer = rg
    rows = tasks.load(split="train", seed=0, task="arc_agi", size=1)
    right = [f"<answer>{rows['answer'][0]}</answer>"]
    assert scorer.score(rows["prompt"], right, **_columns(rows)) == [1.0]
    assert scorer.score(rows["prompt"], right, rg_task=rows["rg_task"], rg_entry=rows["rg_entry"]) == [0.05]


def test_unknown_task_and_field_are_user_errors(rg) -> None:
    tasks, scorer = rg
    with pytest.raises(UserError) as err:
        tasks.load(split="train", seed=0, task="basic_arithmatic")
    assert err.value.where == "data.args.task"
    assert 'did you mean "basic_arithmetic"' in err.value.what
    assert "leg_counting" in err.value.valid and "chain_sum" in err.value.valid
    with pytest.raises(UserError) as err:
        tasks.load(split="train", seed=0, task="basic_arithmetic", max_term=3)
    assert err.value.where == "data.args.max_term" and "max_terms" in err.value.valid
    with pytest.raises(UserError) as err:
        tasks.load(split="train", seed=0, task="basic_arithmetic", min_terms=5, max_terms=2)
    assert "max_terms must be >= min_terms" in err.value.what
    with pytest.raises(UserError) as err:
        scorer.score(["q"], ["1"], rg_task=["nope"], rg_entry=['{"question": "q", "answer": "1"}'])
    assert "row 0" in err.value.where


def test_recipe_resolves_with_the_plugin(rg, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpocli.recipe.loader import load_recipe
    from grpocli.registry import load_plugins

    monkeypatch.setenv("GRPO_DISABLE_PLUGIN_AUTOLOAD", "1")
    import grpo_reasoning_gym.plugin as plugin

    recipe = load_recipe(str(ROOT / "recipes" / "reasoning_gym.toml")).recipe
    plugins = load_plugins(extra=[("reasoning_gym", plugin)])
    assert plugins.datasets.get(recipe.data.dataset).fn is rg[0].load
    for spec in recipe.rewards:
        plugins.rewards.get(spec.name)
    header = (ROOT / "recipes" / "reasoning_gym.toml").read_text().split("\n[", 1)[0]
    assert "pip install ./plugins/grpo-reasoning-gym" in header and "grpo train reasoning_gym" in header
