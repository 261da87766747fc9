"""The layering contract of pyproject.toml ([tool.importlinter]): import-linter checks every
import of grpocli against it (layers point down only; only the command line imports the
trainer; only generation/ and server/ import vllm; the trainer's side, wire/ included, needs no
server package such as fastapi)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_runner import ROOT


def test_imports_follow_the_layering_contract():
    lint = Path(sys.executable).parent / "lint-imports"  # import-linter, from the dev extra
    assert lint.exists(), "import-linter is not installed: pip install -e '.[dev]'"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout
