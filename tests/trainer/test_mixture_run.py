"""A weighted mixture of datasets ([[data.sources]]) in real runs of the tiny model: each source's rows
are scored by its own rewards (the others give None), metrics.jsonl holds each source's rewards and pass@1,
`grpo inspect data` shows the mix, bad sources stop the run before the model loads (exit 2, the source
named), and a run killed with SIGKILL resumes with the same prompts in the same order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import grpo_in_process, sigkill_when

from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir

REWARDS = '''
def has_gold(completions, gold, **kwargs):
    """Needs column gold: only source a has it."""
    return [float(str(g) in str(c)) for c, g in zip(completions, gold)]


def has_target(completions, target, **kwargs):
    """Needs column target: only source b has it."""
    return [float(len(str(c)) % 2 == int(t) % 2) for c, t in zip(completions, target)]
'''

RECIPE = """
[model]
name_or_path = "tiny"
[model.tiny]
hidden_size = 32
num_layers = 1
num_heads = 2
intermediate_size = 64

[data]
chat_template = "always"

[[data.sources]]
name = "a"
dataset = "{root}/a/{{split}}.jsonl"
weight = 3
rewards = ["has_gold", "length"]

[[data.sources]]
name = "b"
dataset = "{root}/b/{{split}}.jsonl"
weight = 1
prompt_column = "question"
rewards = ["has_target"]

[[rewards]]
name = "length"
args = {{ target = 4 }}
[[rewards]]
name = "{root}/rewards.py:has_gold"
[[rewards]]
name = "{root}/rewards.py:has_target"

[generation]
backend = "hf"
num_generations = 2
max_completion_length = 6

[train]
steps = 2
prompts_per_step = 4
micro_batch_size = 8
torch_threads = 1

[log]
progress = "none"
rollouts_every = 1

[eval]
every = 2
n = 2
num_prompts = 3
reward_probes_every = 0
"""


@pytest.fixture
def mix(tmp_path) -> Path:
    """Two local sources with different columns (a: prompt, gold; b: question, target), train and test splits."""
    for split, n in (("train", 10), ("test", 3)):
        for name, row in (("a", lambda i: {"prompt": f"say {i}", "gold": str(i)}),
                          ("b", lambda i: {"question": f"odd or even {i}?", "target": i})):
            folder = tmp_path / name
            folder.mkdir(exist_ok=True)
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in range(n)))
    (tmp_path / "rewards.py").write_text(textwrap.dedent(REWARDS))
    path = tmp_path / "mix.toml"
    path.write_text(RECIPE.format(root=tmp_path))
    return path


@pytest.mark.slow
def test_each_source_has_its_rewards_metrics_and_pass_at_1(mix, tmp_path):
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    train(load_recipe(str(mix), [f"train.output_dir={out}"]))
    run = RunDir(out)
    steps = [m for m in run.read_metrics() if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["data/a/prompts"] + m.get("data/b/prompts", 0) == 4
        assert "rewards/a/has_gold/mean" in m and "rewards/a/length/mean" in m and "reward/a" in m
        assert not any(k.startswith(("rewards/a/has_target", "rewards/b/has_gold", "rewards/b/length")) for k in m)
    assert any("rewards/b/has_target/mean" in m and "reward/b" in m for m in steps)  # b drawn in some step
    evaluated = [m for m in run.read_metrics() if "eval/pass@1" in m]
    assert len(evaluated) == 1 and evaluated[0]["step"] == 2
    e = evaluated[0]
    assert {"eval/a/pass@1", "eval/b/pass@1", "eval/a/rewards/has_gold/mean", "eval/b/rewards/has_target/mean"} <= set(e)
    assert e["eval/a/num_prompts"] == 3 and e["eval/b/num_prompts"] == 3 and e["eval/num_prompts"] == 6
    assert "eval/a/rewards/has_target/mean" not in e
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["step-2-a-test", "step-2-b-test"]
    rows = [json.loads(line) for step in (1, 2) for line in run.rollout_file(step).read_text().splitlines()]
    for row in rows:
        source = row["columns"]["_source"]
        assert source in ("a", "b")
        none = ("has_target",) if source == "a" else ("has_gold", "length")
        assert all(row["rewards"][name] is None for name in none), row
        assert all(row["rewards"][name] is not None for name in row["rewards"] if name not in none), row


@pytest.mark.parametrize("change, said", [
    ('weight = 1\nprompt_column', ('data.sources[1] ("b"): weight = 0', "valid: a number > 0")),
    ('rewards = ["has_target"]', ('data.sources[1] ("b").rewards', "'has_targt'", 'did you mean "has_target"')),
    ('rewards = ["has_target"]', ('data.sources[1] ("b")', "'has_gold'", "parameter 'gold'", "dataset columns: prompt, target")),
    ('rewards = ["has_gold", "length"]', ('data.sources[0] ("a")', "'has_target'", "parameter 'target'")),
    ("empty", ('data.sources[1] ("b")', "the data file is empty")),
])
def test_bad_sources_stop_before_the_model_loads_naming_the_source(mix, tmp_path, monkeypatch, capsys, change, said):
    text = mix.read_text()
    if change == "empty":
        (tmp_path / "b" / "train.jsonl").write_text("")
    elif "weight" in change:
        text = text.replace(change, change.replace("1", "0"), 1)
    elif "has_target" in change and "'has_targt'" in said:
        text = text.replace(change, 'rewards = ["has_targt"]')
    elif "has_target" in change:
        text = text.replace(change, 'rewards = ["has_target", "has_gold"]')
    else:
        text = text.replace(change, 'rewards = ["has_gold", "has_target"]')
    mix.write_text(text)
    code, output = grpo_in_process(monkeypatch, capsys, "train", str(mix), f"train.output_dir={tmp_path / 'run'}")
    assert code == 2, output
    assert "Traceback" not in output
    for needle in said:
        assert needle in output, (needle, output)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before the run began


def test_inspect_data_shows_the_realised_mix(mix, monkeypatch, capsys):
    code, output = grpo_in_process(monkeypatch, capsys, "inspect", "data", str(mix), "--n", "1", "--steps", "50")
    assert code == 0, output
    assert "source 'a'" in output and "source 'b'" in output and "columns: question, target" in output
    assert "the mix of the first 50 steps: 200 prompts" in output
    line = next(line for line in output.splitlines() if line.strip("│ ").startswith("a "))
    cells = [c.strip() for c in line.strip("│").split("│")]
    assert cells[:3] == ["a", "3", "75.0%"] and abs(int(cells[3]) - 150) <= 2, cells
    assert "step 1: a " in output


@pytest.mark.slow
def test_eval_evaluates_each_source_and_check_rewards_says_how(mix, tmp_path, monkeypatch, capsys):
    code, output = grpo_in_process(monkeypatch, capsys, "eval", str(mix), "--base", "--num-prompts", "2", "--n", "2",
                                   "--output-dir", str(tmp_path / "ev"))
    assert code == 0, output
    assert "sources a ('test', 2 prompts), b ('test', 2 prompts)" in output
    for key in ("a/pass@1", "b/pass@1", "a/rewards/has_gold/mean", "b/rewards/has_target/mean"):
        assert key in output, key
    assert "a/rewards/has_target" not in output and "b/rewards/has_gold" not in output
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == ["base-a-test", "base-b-test"]
    summary = json.loads((tmp_path / "ev" / "base-b-test" / "summary.json").read_text())
    assert summary["source"] == "b" and summary["metrics"]["num_prompts"] == 2
    code, output = grpo_in_process(monkeypatch, capsys, "check-rewards", str(mix))
    assert code == 2 and "mixes 2 [[data.sources]]" in output and "data.sources=[]" in output, output


def _command(recipe: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "grpocli.cli.app", "train", str(recipe), f"train.output_dir={out}",
            "train.steps=8", "train.save_steps=1", "eval.every=0"]


def _prompts(out: Path) -> list[list[tuple[str, str]]]:
    """Each step's prompts (with their sources) in group order, from rollouts/step-N.jsonl."""
    run, steps = RunDir(out), []
    for step in range(1, 9):
        groups: dict[int, tuple[str, str]] = {}
        for line in run.rollout_file(step).read_text().splitlines():
            row = json.loads(line)
            groups[row["group"]] = (row["columns"]["_source"], row["prompt"])
        steps.append([groups[g] for g in sorted(groups)])
    return steps


@pytest.mark.slow
def test_sigkill_then_resume_draws_the_same_prompts_in_the_same_order(mix, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    whole = tmp_path / "whole"
    done = subprocess.run(_command(mix, whole), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = tmp_path / "killed"
    run = RunDir(killed)
    sigkill_when(_command(mix, killed), lambda: any(step >= 2 for step, _ in run.list_checkpoints()), env=env,
                 within=300, what="checkpoint step-2")
    at = run.latest_checkpoint()[0]
    assert 2 <= at < 8
    state = json.loads((run.latest_checkpoint()[1] / "trainer" / "state.json").read_text())
    assert state["position"] == 4 * at  # the mixture's whole state: prompts drawn so far
    # the same command (log.progress may change on resume: plain lines say where it resumed)
    again = subprocess.run([*_command(mix, killed), "log.progress=plain"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {run.checkpoints / f'step-{at}'} (step {at})" in again.stderr + again.stdout
    assert [m["step"] for m in run.read_metrics()] == list(range(1, 9))
    expected = _prompts(whole)
    assert _prompts(killed) == expected
    assert {source for step in expected for source, _ in step} == {"a", "b"}
