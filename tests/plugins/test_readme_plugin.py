"""The plugin example in docs/plugins.md works as written: its my_plugin.py and pyproject.toml are
taken from that page, installed with pip into a temporary directory (the venv is not
touched), and `grpo` then lists the plugin and trains with its reward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import install_plugin

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "plugins.md"
DIST = "grpo-mine"
FAST = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "generation.max_completion_length=8",
    "generation.num_generations=4", "train.prompts_per_step=4", "train.steps=1",
    "train.micro_batch_size=4", "log.progress=none", "data.args={num_samples=16}",
]


def readme_block(first_line: str) -> str:
    """The indented code block of the docs' plugin page that starts with ``first_line``."""
    lines = PAGE.read_text().splitlines()
    start = lines.index("    " + first_line)
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"


def test_readme_blocks_are_the_whole_files() -> None:
    module, pyproject = readme_block("# my_plugin.py"), readme_block("# pyproject.toml")
    assert "def my_reward(" in module and "@grpocli.hookimpl" in module
    assert "[build-system]" in pyproject and "[project.entry-points.grpo]" in pyproject
    assert "pyproject" not in module and "import" not in pyproject  # two blocks, not one
    compile(module, "my_plugin.py", "exec")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' plugin, exactly as written there, installed with ``pip install --target``."""
    root = tmp_path_factory.mktemp("readme_plugin")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "my_plugin.py").write_text(readme_block("# my_plugin.py"))
    (pkg / "pyproject.toml").write_text(readme_block("# pyproject.toml"))
    return install_plugin(pkg, root / "site")


def grpo(site: Path, *args: str) -> subprocess.CompletedProcess:
    """`grpo ARGS` with the installed plugin on the path (and no plugin selection set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRPO_PLUGINS", "GRPO_DISABLE_PLUGIN_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["COLUMNS"] = "250"  # rich wraps table cells to the terminal width
    return subprocess.run([sys.executable, "-m", "grpocli.cli.app", *args], capture_output=True,
                          text=True, env=env, cwd=site.parent, timeout=300)


def test_inspect_plugins_lists_the_readme_plugin(installed: Path) -> None:
    done = grpo(installed, "inspect", "plugins")
    assert done.returncode == 0, done.stderr
    # the plugin's row names its distribution and what it registered
    assert any(DIST in row and "mine.reward" in row for row in done.stdout.splitlines()), done.stdout


def test_a_misspelt_arg_of_the_readme_reward_is_refused(installed: Path) -> None:
    done = grpo(installed, "train", "quickstart", 'rewards=[{name="mine.reward", args={wrod="7"}}]', "--dry-run")
    assert done.returncode == 2, done.stderr
    assert "rewards[0].args.wrod" in done.stderr and "'mine.reward'" in done.stderr
    assert "valid: word" in done.stderr


@pytest.mark.slow
def test_train_with_the_readme_reward(installed: Path) -> None:
    out = installed.parent / "run"
    done = grpo(installed, "train", "quickstart", 'rewards=[{name="mine.reward", args={word="7"}}]',
                *FAST, f"train.output_dir={out}")
    assert done.returncode == 0, done.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert "rewards/mine.reward/mean" in metrics[0]
