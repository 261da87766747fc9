"""`grpo --help` and every subcommand's help explain themselves and import neither torch nor vllm."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_runner import ROOT

COMMANDS = [[], ["train"], ["vllm-serve"], ["serve"], ["ref-serve"], ["reward-serve"], ["eval"], ["export"], ["inspect"], ["plan"], ["bench"], ["import"], ["import", "trl"]]

PROBE = """
import sys
from grpocli.cli.app import app
try:
    app({args!r}, prog_name="grpo")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
heavy = sorted(m for m in ("torch", "vllm", "transformers", "accelerate", "datasets") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "grpo")
def test_help_explains_itself_without_heavy_imports(command):
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=[*command, "--help"])],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY:\n" in out.stdout, out.stdout.splitlines()[-1]
    assert "Usage" in out.stdout
    assert "grpo " in out.stdout  # every help shows an example command line


def test_version(grpo):
    out = grpo("--version")
    assert out.returncode == 0 and out.stdout.startswith("grpo ")


def test_inspect_data_shows_rendered_prompts_and_columns(grpo):
    out = grpo("inspect", "data", "quickstart", "--n", "2", "data.system_prompt=Be brief.")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("row ") == 2
    assert "answer:" in out.stdout and "prompt_text:" in out.stdout
    assert "<|im_start|>system\nBe brief.<|im_end|>" in out.stdout


def test_inspect_recipes_lists_builtins(grpo):
    out = grpo("inspect", "recipes", env={"COLUMNS": "200"})
    assert out.returncode == 0 and "quickstart" in out.stdout and "countdown_tiny" in out.stdout
