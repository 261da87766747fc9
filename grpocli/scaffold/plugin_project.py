"""A pip-installable grpo plugin project (`grpo new plugin NAME`): a pyproject with the `grpo`
entry point, one reward, one dataset, a recipe using both, a test that trains through grpo, a README.

The files follow the plugin contract (grpocli.registry.hookspecs) the way the built-ins and
plugins/grpo-reasoning-gym do: `pip install -e .` and `grpo inspect plugins` lists the two names."""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

from grpocli.errors import UserError

#: A distribution name grpo accepts for a new plugin: lowercase, digits, dashes (PEP 503 normalised).
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

PYPROJECT = '''\
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "$dist"
version = "0.1.0"
description = "grpo plugin: the $short dataset and the $short.exact reward."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["grpocli"]

[project.optional-dependencies]
test = ["pytest>=8"]

# grpo finds plugins through this entry-point group (pluggy): the module holds the hook functions.
[project.entry-points.grpo]
$module = "$module.plugin"

[tool.hatch.build.targets.wheel]
packages = ["$module"]
'''

PLUGIN = '''\
"""The hooks grpo calls (grpocli.registry.hookspecs): one dataset and one reward.

Keep imports here light: grpo loads every installed plugin when it starts."""

from __future__ import annotations

import grpocli

from $module.dataset import load
from $module.reward import exact


@grpocli.hookimpl
def register_datasets(register) -> None:
    register("$short", load, description="sums of two numbers with their answers; args: num_samples, high")


@grpocli.hookimpl
def register_rewards(register) -> None:
    register("$short.exact", exact, description="1.0 when the completion's last number is the row's answer")
'''

DATASET = '''\
"""The $short dataset: rows with a `prompt` and the `answer` the reward checks.

grpo calls a dataset loader with the split, the run's seed and the recipe's `data.args`; it returns
a list of dicts (or a datasets.Dataset). Extra columns reach every reward as keyword arguments."""

from __future__ import annotations

import random


def load(split: str, seed: int, num_samples: int = 256, high: int = 20) -> list[dict]:
    """`num_samples` rows of "What is a + b?"; the eval split draws different numbers."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for _ in range(num_samples):
        a, b = rng.randint(0, high), rng.randint(0, high)
        rows.append({"prompt": f"What is {a} + {b}? Answer with a number.", "answer": str(a + b)})
    return rows
'''

REWARD = '''\
"""The $short.exact reward, written as a TRL reward function: it works in TRL's GRPOTrainer too.

grpo passes `prompts`, `completions` and every dataset column (here `answer`) as keywords; take only
what you need and end with **kwargs. Return one float (or None: no score) per completion."""

from __future__ import annotations

import re


def exact(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last number equals the row's answer, else 0.0."""
    scores = []
    for completion, gold in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\\d+", text)
        scores.append(1.0 if numbers and numbers[-1] == str(gold) else 0.0)
    return scores
'''

RECIPE = '''\
# $dist: a tiny model (built offline) trained on the $short dataset with the $short.exact reward.
# Command: grpo train recipe.toml          (a real model: set model.name_or_path)
[model]
name_or_path = "tiny"

[data]
dataset = "$short"
chat_template = "always"
args = { num_samples = 64 }

[[rewards]]
name = "$short.exact"

[[rewards]]
name = "length"     # a built-in: gives the tiny model a signal while it cannot yet add
args = { target = 4 }
weight = 0.1

[generation]
num_generations = 4
max_completion_length = 8

[train]
steps = 2
prompts_per_step = 2
learning_rate = 1e-3
'''

TEST = '''\
"""The plugin's contract, as grpo sees it: its names are registered, the reward scores, and a
one-step run of recipe.toml trains through grpo (a real subprocess, a tiny model, offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from $module.reward import exact

PROJECT = Path(__file__).resolve().parent.parent


def grpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpocli.cli.app", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)


def test_the_reward_scores_right_and_wrong_answers():
    assert exact(["It is 7", [{"role": "assistant", "content": "3"}], ""], answer=["7", "4", "1"]) == [1.0, 0.0, 0.0]


def test_grpo_lists_the_plugin(tmp_path):
    out = grpo("inspect", "plugins", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "$short.exact" in out.stdout and "$dist" in out.stdout


def test_one_step_trains_through_grpo(tmp_path):
    run = tmp_path / "run"
    out = grpo("train", str(PROJECT / "recipe.toml"), "train.steps=1", f"train.output_dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/$short.exact/mean" in line  # the reward, under its registered name
'''

README = '''\
# $dist

A [grpo](https://pypi.org/project/grpocli/) plugin: the `$short` dataset and the `$short.exact` reward.

```bash
pip install -e '.[test]'     # grpo finds it through the `grpo` entry point
grpo inspect plugins         # lists $short and $short.exact
grpo train recipe.toml       # a tiny model, offline, seconds
pytest                       # the plugin's own tests, through grpo
```

- `$module/plugin.py`: the hooks grpo calls (`register_datasets`, `register_rewards`).
- `$module/dataset.py`: the loader (split, seed, args -> rows with `prompt` and `answer`).
- `$module/reward.py`: a TRL-style reward function (`completions`, dataset columns as keywords).
'''

FILES = {
    "pyproject.toml": PYPROJECT, "README.md": README, "recipe.toml": RECIPE,
    "$module/__init__.py": '"""$dist: a grpo plugin."""\n', "$module/plugin.py": PLUGIN,
    "$module/dataset.py": DATASET, "$module/reward.py": REWARD, "tests/test_plugin.py": TEST,
}


def names(dist: str) -> dict[str, str]:
    """dist (grpo-demo) -> module (grpo_demo) and short name (demo), checked."""
    if not NAME.match(dist):
        raise UserError(f"{dist!r} is not a plugin name grpo can write", where="grpo new plugin NAME",
                        valid="lowercase letters, digits and single dashes, starting with a letter "
                              "(e.g. grpo-myrewards)", hint="grpo new plugin grpo-myrewards")
    module = dist.replace("-", "_")
    short = dist.removeprefix("grpo-").replace("-", "_")
    if keyword.iskeyword(module) or keyword.iskeyword(short):
        raise UserError(f"{dist!r} makes a Python keyword", where="grpo new plugin NAME",
                        valid="a name that is not a Python keyword", hint="grpo new plugin grpo-myrewards")
    return {"dist": dist, "module": module, "short": short}


def plugin_files(dist: str) -> dict[str, str]:
    """{relative path: text} of the project."""
    values = names(dist)
    return {Template(path).substitute(values): Template(text).substitute(values) for path, text in FILES.items()}


def write_plugin(dist: str, parent: Path) -> Path:
    """Write the project under parent/dist; refuse (exit 2) an existing, non-empty folder."""
    files = plugin_files(dist)
    root = parent / dist
    if root.exists() and any(root.iterdir()):
        raise UserError(f"{root} exists and is not empty; nothing was written", where="grpo new plugin -o",
                        valid="a new or empty folder", hint=f"grpo new plugin {dist} -o SOMEWHERE_ELSE")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
